package paymentresource

import (
	"context"
	"fmt"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/jackc/pgx/v5"
)

// Resolution of a payout in doubt (POST /v1/payouts/{id}/resolution): the
// outcome of its one rail submission, established by rail-proxy's
// reconciliation from the rail's own record and signed by rail-proxy. It is
// a fenced write like every other of a lock holder: the resolver holds the
// payout's lease, its token is verified against payout:{account} and
// passes the payout fence (non-strict) and, for an ACK, the account fence
// (strict). ACK and DECLINE take the result path (receipt, rail_result
// idempotency, the one debit); NONE fails the payout.
const (
	failFenced = `UPDATE payout SET state = 'failed', fence = $2, owner_id = NULLIF($3, ''), rail_token = $4, attention_reason = NULL
WHERE payout_id = $1 AND state IN ('claimed', 'submitted', 'ambiguous', 'needs_attention') AND fence <= $2 AND $2 >= (SELECT a.fence FROM account a WHERE a.account_id = payout.account_id)`
	failUnfenced = `UPDATE payout SET state = 'failed', fence = greatest(fence, $2), owner_id = NULLIF($3, ''), rail_token = $4, attention_reason = NULL
WHERE payout_id = $1 AND state IN ('claimed', 'submitted', 'ambiguous', 'needs_attention')`
)

// resolveTx records a resolution for the holder h. The same resolution
// sent again changes nothing (an ACK or DECLINE is replayed through
// rail_result; a NONE finds the payout failed). It returns
// ErrUnverifiedToken, ErrInvalidReceipt, ErrFencedOut, ErrPayoutFinished,
// ErrRailRefConflict, ErrPayoutNotClaimed (a pending payout),
// ErrPayoutNotFound, ErrUnavailable.
func (s *Service) resolveTx(ctx context.Context, id string, h fencewire.Holder, req api.ResolutionRequest) (api.Payout, error) {
	if req.Outcome != api.OutcomeNone {
		before, err := s.payout(ctx, id)
		if err != nil {
			return api.Payout{}, err
		}
		if before.State == api.StatePending {
			return api.Payout{}, fmt.Errorf("%w: payout %s is pending", ErrPayoutNotClaimed, id)
		}
		p, err := s.result(ctx, id, h, api.ResultRequest(req))
		if err == nil && p.State != before.State {
			s.log.WarnContext(ctx, "payout in doubt resolved", "event", api.EventPayoutResolved, "payoutId", id, "accountId", p.AccountID,
				"token", h.Token, "ownerId", h.Owner, "outcome", string(req.Outcome), "from", string(before.State), "to", string(p.State))
		}
		return p, err
	}
	var (
		p       api.Payout
		from    api.State
		changed bool
	)
	err := s.inTx(ctx, "resolution", func(tx pgx.Tx) error {
		l, err := lockPayout(ctx, tx, id)
		if err != nil {
			return err
		}
		if err := s.verifyToken(ctx, id, l, h); err != nil {
			return err
		}
		rec := fencewire.RailReceipt{PayoutID: id, AccountID: l.accountID, AmountMinor: l.amount, Currency: l.currency,
			Outcome: string(api.OutcomeNone), RailRef: "", RailToken: req.RailToken}
		if err := s.checkReceipt(req.Receipt, rec); err != nil {
			return fmt.Errorf("%w: %s %s with rail token %d: %w", ErrInvalidReceipt, req.Outcome, id, req.RailToken, err)
		}
		from = l.state
		if l.state == api.StateFailed && (!s.fencing || l.fence <= h.Token) {
			p, err = loadPayout(ctx, tx, id)
			return err
		}
		if l.state == api.StatePending {
			return fmt.Errorf("%w: payout %s is pending", ErrPayoutNotClaimed, id)
		}
		q := failFenced
		if !s.fencing {
			q = failUnfenced
		}
		tag, err := tx.Exec(ctx, q, id, h.Token, h.Owner, req.RailToken)
		if err != nil {
			return dbError("resolution", err)
		}
		if tag.RowsAffected() == 0 {
			return s.refused(ctx, tx, id, l, h.Token, h.Owner, false)
		}
		if err := transition(ctx, tx, id, l.state, api.StateFailed, h.Token, h.Owner); err != nil {
			return err
		}
		changed = true
		p, err = loadPayout(ctx, tx, id)
		return err
	})
	if err != nil {
		return api.Payout{}, err
	}
	if changed {
		s.log.WarnContext(ctx, "payout failed: its submission never reached the rail", "event", api.EventPayoutFailed,
			"payoutId", id, "accountId", p.AccountID, "token", h.Token, "ownerId", h.Owner, "railToken", req.RailToken, "from", string(from))
	}
	return p, nil
}

// listPayouts returns a page of the payouts in state, in payout id order,
// after the payout id after, without their history.
func (s *Service) listPayouts(ctx context.Context, state api.State, limit int, after string) (api.PayoutList, error) {
	rows, err := s.pool.Query(ctx, `SELECT payout_id, account_id, amount_minor, currency, state, fence,
       coalesce(owner_id, ''), coalesce(rail_ref, ''), coalesce(rail_token, 0), coalesce(attention_reason, ''),
       (SELECT count(*) FROM ledger_txn t WHERE t.payout_id = p.payout_id AND t.kind = 'payout_debit'),
       created_at, updated_at
FROM payout p WHERE state = $1 AND payout_id > $2 ORDER BY payout_id LIMIT $3`, string(state), after, limit+1)
	if err != nil {
		return api.PayoutList{}, dbError("list payouts", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (api.Payout, error) {
		var p api.Payout
		err := r.Scan(&p.PayoutID, &p.AccountID, &p.AmountMinor, &p.Currency, &p.State, &p.Fence,
			&p.OwnerID, &p.RailRef, &p.RailToken, &p.AttentionReason, &p.Debits, &p.CreatedAt, &p.UpdatedAt)
		p.CreatedAt, p.UpdatedAt = p.CreatedAt.UTC(), p.UpdatedAt.UTC()
		return p, err
	})
	if err != nil {
		return api.PayoutList{}, dbError("list payouts", err)
	}
	out := api.PayoutList{Payouts: list}
	if out.Payouts == nil {
		out.Payouts = []api.Payout{}
	}
	if len(out.Payouts) > limit {
		out.Payouts = out.Payouts[:limit]
		out.Next = out.Payouts[limit-1].PayoutID
	}
	return out, nil
}
