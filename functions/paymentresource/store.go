package paymentresource

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgerr"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
	"github.com/jackc/pgx/v5"
)

// Fence point one. Each write made for a lock holder is one conditional
// UPDATE whose WHERE clause is the fence; a statement that matches no row
// is the refusal (the row was locked and read just before, only to explain
// the refusal). With the kill switch off the same statements run without
// the fence predicates, and a fence column still only grows.
const (
	// claimFenced claims a payout: non-strict (fence <= token), so that
	// the holder may go on to post with the same token.
	claimFenced = `UPDATE payout SET state = 'claimed', fence = $2, owner_id = NULLIF($3, '')
WHERE payout_id = $1 AND state IN ('pending', 'claimed') AND fence <= $2 AND $2 >= (SELECT a.fence FROM account a WHERE a.account_id = payout.account_id)`
	claimUnfenced = `UPDATE payout SET state = 'claimed', fence = greatest(fence, $2), owner_id = NULLIF($3, '')
WHERE payout_id = $1 AND state IN ('pending', 'claimed')`

	// postFenced marks a payout posted (non-strict on the payout row).
	postFenced = `UPDATE payout SET state = 'posted', fence = $2, owner_id = NULLIF($3, ''), rail_token = $5, rail_ref = $4, attention_reason = NULL
WHERE payout_id = $1 AND state IN ('claimed', 'submitted', 'ambiguous', 'needs_attention') AND fence <= $2 AND $2 >= (SELECT a.fence FROM account a WHERE a.account_id = payout.account_id)`
	// postUnfenced also accepts an already posted payout: a second ACK
	// with a new rail reference becomes a second debit, the corruption the
	// experiment shows.
	postUnfenced = `UPDATE payout SET state = 'posted', fence = greatest(fence, $2), owner_id = NULLIF($3, ''), rail_token = $5, rail_ref = $4, attention_reason = NULL
WHERE payout_id = $1 AND state IN ('claimed', 'submitted', 'ambiguous', 'needs_attention', 'posted')`

	// debitFenced is the account debit: STRICT (fence < token), one debit
	// per token, never one by a token older than the last debit.
	debitFenced = `UPDATE account SET balance_minor = balance_minor - $2, fence = $3
WHERE account_id = $1 AND currency = $4 AND fence < $3`
	debitUnfenced = `UPDATE account SET balance_minor = balance_minor - $2, fence = greatest(fence, $3)
WHERE account_id = $1 AND currency = $4`

	declineFenced = `UPDATE payout SET state = 'declined', fence = $2, owner_id = NULLIF($3, ''), rail_token = $5, rail_ref = $4, attention_reason = NULL
WHERE payout_id = $1 AND state IN ('claimed', 'submitted', 'ambiguous', 'needs_attention') AND fence <= $2 AND $2 >= (SELECT a.fence FROM account a WHERE a.account_id = payout.account_id)`
	declineUnfenced = `UPDATE payout SET state = 'declined', fence = greatest(fence, $2), owner_id = NULLIF($3, ''), rail_token = $5, rail_ref = $4, attention_reason = NULL
WHERE payout_id = $1 AND state IN ('claimed', 'submitted', 'ambiguous', 'needs_attention')`

	ambiguousFenced = `UPDATE payout SET state = 'ambiguous', fence = $2, owner_id = NULLIF($3, ''), rail_token = $5, rail_ref = coalesce(NULLIF($4, ''), rail_ref), attention_reason = NULL
WHERE payout_id = $1 AND state IN ('claimed', 'submitted', 'ambiguous', 'needs_attention') AND fence <= $2 AND $2 >= (SELECT a.fence FROM account a WHERE a.account_id = payout.account_id)`
	ambiguousUnfenced = `UPDATE payout SET state = 'ambiguous', fence = greatest(fence, $2), owner_id = NULLIF($3, ''), rail_token = $5, rail_ref = coalesce(NULLIF($4, ''), rail_ref), attention_reason = NULL
WHERE payout_id = $1 AND state IN ('claimed', 'submitted', 'ambiguous', 'needs_attention')`

	// attentionFenced marks a payout needs_attention (non-strict on the
	// payout row, like every step of a holder). A finished payout is never
	// touched, whatever the token.
	attentionFenced = `UPDATE payout SET state = 'needs_attention', attention_reason = $4, fence = $2, owner_id = NULLIF($3, '')
WHERE payout_id = $1 AND state IN ('pending', 'claimed', 'submitted', 'ambiguous') AND fence <= $2 AND $2 >= (SELECT a.fence FROM account a WHERE a.account_id = payout.account_id)`
	attentionUnfenced = `UPDATE payout SET state = 'needs_attention', attention_reason = $4, fence = greatest(fence, $2), owner_id = NULLIF($3, '')
WHERE payout_id = $1 AND state IN ('pending', 'claimed', 'submitted', 'ambiguous')`

	// coalesceReclaim folds a re-claim into the payout's last history row
	// when that row is itself a re-claim (claimed -> claimed): the row
	// keeps the latest token, owner and time and counts the claims.
	// The payout's updated_at takes the row's new time in the same
	// statement (see insertTransition).
	coalesceReclaim = `WITH t AS (
  UPDATE payout_transition SET token = $2, owner_id = NULLIF($3, ''), at = clock_timestamp(), claims = claims + 1
  WHERE transition_id = (SELECT max(transition_id) FROM payout_transition WHERE payout_id = $1)
    AND from_state = 'claimed' AND to_state = 'claimed'
  RETURNING at)
UPDATE payout SET updated_at = t.at FROM t WHERE payout.payout_id = $1`
)

// step wraps a fenced payout UPDATE whose parameters are $1 payout id, $2
// token, $3 owner and up to $n-1 more, so that the same statement also
// stamps the payout's updated_at (clock_timestamp(), once), appends its
// history rows with that time (from the states in $n, to those in $n+1,
// text arrays, in order) and returns the payout row (payoutRowSQL's
// columns): one statement instead of the UPDATE, a history insert per
// row and a read-back. When the UPDATE matches no row (the fence refused,
// or the state does not allow the step) it writes nothing and returns no
// row.
func step(update string, n int) string {
	set, ok := strings.CutPrefix(update, "UPDATE payout SET ")
	if !ok {
		panic("paymentresource: step of a statement that does not update payout: " + update)
	}
	return fmt.Sprintf(`WITH u AS (UPDATE payout SET updated_at = clock_timestamp(), %s
  RETURNING payout_id, account_id, amount_minor, currency, state, fence, owner_id, rail_ref, rail_token, attention_reason, created_at, updated_at),
h AS (INSERT INTO payout_transition (payout_id, from_state, to_state, token, owner_id, at)
  SELECT u.payout_id, s.f, s.t, $2, u.owner_id, u.updated_at FROM u, unnest($%d::text[], $%d::text[]) WITH ORDINALITY AS s (f, t, i) ORDER BY s.i)
SELECT payout_id, account_id, amount_minor, currency, state, fence,
       coalesce(owner_id, ''), coalesce(rail_ref, ''), coalesce(rail_token, 0), coalesce(attention_reason, ''),
       (SELECT count(*) FROM ledger_txn t WHERE t.payout_id = u.payout_id AND t.kind = 'payout_debit'),
       created_at, updated_at
FROM u`, set, n, n+1)
}

// The steps a holder takes most: the first claim, and each result with
// the rail token ($5).
var (
	claimStepFenced       = step(claimFenced, 4)
	claimStepUnfenced     = step(claimUnfenced, 4)
	postStepFenced        = step(postFenced, 6)
	postStepUnfenced      = step(postUnfenced, 6)
	declineStepFenced     = step(declineFenced, 6)
	declineStepUnfenced   = step(declineUnfenced, 6)
	ambiguousStepFenced   = step(ambiguousFenced, 6)
	ambiguousStepUnfenced = step(ambiguousUnfenced, 6)
)

// steps returns the from and to arrays of step's history rows for a
// change from state from through each of tos in turn.
func steps(from api.State, tos ...api.State) (froms, to []string) {
	for _, t := range tos {
		froms, to = append(froms, string(from)), append(to, string(t))
		from = t
	}
	return froms, to
}

// availableBalance is an account's balance minus the amounts of its
// payouts that are not final (every state but posted, declined and
// failed): the money a new payout may still take. It is read inside the
// creating transaction, after the account row is locked, and clamped to
// int64 (the sum is numeric).
const availableBalance = `SELECT greatest(least(a.balance_minor - coalesce((SELECT sum(p.amount_minor) FROM payout p
    WHERE p.account_id = a.account_id AND p.state NOT IN ('posted', 'declined', 'failed')), 0),
  9223372036854775807), -9223372036854775808)::bigint
FROM account a WHERE a.account_id = $1`

// Ledger accounts of a payout debit.
const (
	ledgerAccountPrefix = "account:"
	ledgerRailClearing  = "rail:clearing"
	kindPayoutDebit     = "payout_debit"
)

// rollbackTimeout bounds the rollback of a transaction whose request
// context has ended.
const rollbackTimeout = 5 * time.Second

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// inTx runs fn in a READ COMMITTED transaction and commits when fn returns
// nil; fn's error is returned as is and rolls the transaction back.
func (s *Service) inTx(ctx context.Context, op string, fn func(pgx.Tx) error) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return dbError(op+": begin", err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		_ = tx.Rollback(rctx) // no-op after Commit
	}()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return dbError(op+": commit", err)
	}
	return nil
}

// dbError classifies an error of the database driver (pgerr.Unavailable):
// a lost connection, a timeout, a cancellation, a serialization failure,
// a deadlock, exhausted resources or an I/O error wrap
// ErrUnavailable (the outcome is unknown; the request may be retried, every
// write here being idempotent or fenced); anything else is a bug.
func dbError(op string, err error) error {
	if pgerr.Unavailable(err) {
		return fmt.Errorf("%w: %s: %v", ErrUnavailable, op, err)
	}
	return fmt.Errorf("paymentresource: %s: %w", op, err)
}

const accountCols = `account_id, currency, opening_balance_minor, balance_minor, fence, created_at`

func scanAccount(row pgx.Row) (api.Account, error) {
	var a api.Account
	err := row.Scan(&a.AccountID, &a.Currency, &a.OpeningBalanceMinor, &a.BalanceMinor, &a.Fence, &a.CreatedAt)
	a.CreatedAt = a.CreatedAt.UTC()
	return a, err
}

// createAccount inserts the account, or returns the existing one when it
// has the same currency and opening balance (created=false).
func (s *Service) createAccount(ctx context.Context, req api.AccountRequest) (a api.Account, created bool, err error) {
	a, err = scanAccount(s.pool.QueryRow(ctx, `INSERT INTO account (account_id, currency, opening_balance_minor, balance_minor)
VALUES ($1, $2, $3, $3) ON CONFLICT (account_id) DO NOTHING RETURNING `+accountCols,
		req.AccountID, req.Currency, *req.OpeningBalanceMinor))
	switch {
	case err == nil:
		s.log.InfoContext(ctx, "account created", "event", api.EventAccountCreated, "accountId", a.AccountID,
			"currency", a.Currency, "openingBalanceMinor", a.OpeningBalanceMinor)
		return a, true, nil
	case !errors.Is(err, pgx.ErrNoRows):
		return api.Account{}, false, dbError("create account", err)
	}
	a, err = s.account(ctx, req.AccountID)
	if err != nil {
		return api.Account{}, false, err
	}
	if d := differing(diff{"currency", a.Currency != req.Currency}, diff{"openingBalanceMinor", a.OpeningBalanceMinor != *req.OpeningBalanceMinor}); d != "" {
		// Which fields differ, never their stored values: the answer must
		// not tell a caller an account's balance it did not already send.
		return api.Account{}, false, fmt.Errorf("%w: account %s exists with a different %s", ErrAccountConflict, a.AccountID, d)
	}
	return a, false, nil
}

// account returns the account, or ErrAccountNotFound.
func (s *Service) account(ctx context.Context, id string) (api.Account, error) {
	a, err := scanAccount(s.pool.QueryRow(ctx, `SELECT `+accountCols+` FROM account WHERE account_id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return api.Account{}, fmt.Errorf("%w: %q", ErrAccountNotFound, id)
	}
	if err != nil {
		return api.Account{}, dbError("read account", err)
	}
	return a, nil
}

// termsConflict returns an error wrapping ErrPayoutConflict when req asks
// for payout p's id with other terms, nil when they are the same. It names
// the fields that differ and never their stored values: the answer to a
// caller that reuses a payout id must not tell it another payout's amount,
// currency or account.
func termsConflict(p api.Payout, req api.PayoutRequest) error {
	d := differing(diff{"accountId", p.AccountID != req.AccountID}, diff{"amountMinor", p.AmountMinor != req.AmountMinor},
		diff{"currency", p.Currency != req.Currency})
	if d == "" {
		return nil
	}
	return fmt.Errorf("%w: payout %s exists with a different %s", ErrPayoutConflict, p.PayoutID, d)
}

// diff is one field of a create request compared with the stored row:
// its JSON name and whether the values differ.
type diff struct {
	field   string
	differs bool
}

// differing returns the JSON names of the fields that differ, joined with
// " and ", or "" when none does.
func differing(fields ...diff) string {
	var names []string
	for _, f := range fields {
		if f.differs {
			names = append(names, f.field)
		}
	}
	return strings.Join(names, " and ")
}

// createPayout inserts the payout, its creation transition and the outbox
// row of its event in one transaction (one round trip when it is created:
// createFast), or returns the existing payout when
// it has the same account, amount and currency (created=false, no new
// outbox row). A new payout larger than the account's available balance
// (availableBalance) is refused with ErrInsufficientFunds and changes
// nothing.
func (s *Service) createPayout(ctx context.Context, req api.PayoutRequest) (p api.Payout, created bool, err error) {
	data, attrs, err := eventRow(ctx, req)
	if err != nil {
		return api.Payout{}, false, err
	}
	if p, created, err = s.createFast(ctx, req, data, attrs); err != nil {
		return api.Payout{}, false, err
	}
	if !created {
		p, created, err = s.createSlow(ctx, req, data, attrs)
		if err != nil {
			return api.Payout{}, false, err
		}
	}
	if created {
		creations.Inc()
		s.log.InfoContext(ctx, "payout created", "event", api.EventPayoutCreated, "payoutId", p.PayoutID, "accountId", p.AccountID,
			"amountMinor", p.AmountMinor, "currency", p.Currency)
		s.outbox.wake()
	}
	return p, created, nil
}

// eventRow returns the outbox row of req's payout event: the message
// body and its attributes (JSON), with the creating request's trace
// context (traceparent), so that the outbox's publish span continues
// that trace.
func eventRow(ctx context.Context, req api.PayoutRequest) (data []byte, attrs string, err error) {
	ev := payoutevent.Event{PayoutID: req.PayoutID, AccountID: req.AccountID, AmountMinor: req.AmountMinor, Currency: req.Currency}
	if data, err = json.Marshal(ev); err != nil {
		return nil, "", fmt.Errorf("paymentresource: encode event: %w", err)
	}
	attrMap := map[string]string{payoutevent.AttrPayoutID: ev.PayoutID, payoutevent.AttrAccountID: ev.AccountID}
	tracing.Inject(ctx, attrMap)
	a, err := json.Marshal(attrMap)
	if err != nil {
		return nil, "", fmt.Errorf("paymentresource: encode attributes: %w", err)
	}
	return data, string(a), nil
}

// createSlow is createPayout in a transaction of several statements (the
// slow path): it answers every case createFast does not accept.
func (s *Service) createSlow(ctx context.Context, req api.PayoutRequest, data []byte, attrs string) (p api.Payout, created bool, err error) {
	err = s.inTx(ctx, "create payout", func(tx pgx.Tx) error {
		// The account row is locked (FOR UPDATE) until commit: creations
		// on one account are serialized, so two of them can never both
		// count the same available balance.
		var ccy string
		err := tx.QueryRow(ctx, `SELECT currency FROM account WHERE account_id = $1 FOR UPDATE`, req.AccountID).Scan(&ccy)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: %q", ErrAccountNotFound, req.AccountID)
		}
		if err != nil {
			return dbError("create payout: read account", err)
		}
		if ccy != req.Currency {
			// Not which currency the account has: the stored terms of an
			// account are not told to whoever names it (as for conflicts).
			return fmt.Errorf("%w: payout in %s is not in account %s's currency", ErrCurrencyMismatch, req.Currency, req.AccountID)
		}
		var available int64
		if err := tx.QueryRow(ctx, availableBalance, req.AccountID).Scan(&available); err != nil {
			return dbError("create payout: available balance", err)
		}
		if req.AmountMinor > available {
			// A replay of an existing payout is answered from that payout
			// (200 or PAYOUT_CONFLICT), whatever the balance is now.
			existing, err := loadPayout(ctx, tx, req.PayoutID)
			if errors.Is(err, ErrPayoutNotFound) {
				// The available balance itself is not told: whoever can
				// name an account would otherwise read its balance.
				return fmt.Errorf("%w: payout of %d %s is above account %s's available balance", ErrInsufficientFunds,
					req.AmountMinor, req.Currency, req.AccountID)
			}
			if err != nil {
				return err
			}
			if err := termsConflict(existing, req); err != nil {
				return err
			}
			p = existing
			return nil
		}
		// The payout row, its creation transition, the outbox row and the
		// read-back in one statement; no row when the id exists.
		p, err = scanPayoutRow(tx.QueryRow(ctx, createPayoutSQL, req.PayoutID, req.AccountID, req.AmountMinor, req.Currency, data, attrs), req.PayoutID)
		if errors.Is(err, ErrPayoutNotFound) {
			if p, err = loadPayout(ctx, tx, req.PayoutID); err != nil {
				return err
			}
			return termsConflict(p, req)
		}
		if err != nil {
			return err
		}
		created = true
		return nil
	})
	return p, created, err
}

// createPayoutSQL inserts payout $1 (account $2, amount $3, currency $4)
// unless the id exists, and with it its creation transition and the
// outbox row of its event (data $5, attributes $6), all with one time
// (the payout's created_at and updated_at are its history row's at), and
// returns the payout row (payoutRowSQL's columns); no row when the id
// exists.
const createPayoutSQL = `WITH n AS (SELECT clock_timestamp() AS at),
p AS (INSERT INTO payout (payout_id, account_id, amount_minor, currency, created_at, updated_at)
  SELECT $1::text, $2::text, $3::bigint, $4::text, n.at, n.at FROM n ON CONFLICT (payout_id) DO NOTHING
  RETURNING payout_id, account_id, amount_minor, currency, state, fence, owner_id, rail_ref, rail_token, attention_reason, created_at, updated_at),
h AS (INSERT INTO payout_transition (payout_id, to_state, at) SELECT payout_id, 'pending', created_at FROM p),
o AS (INSERT INTO outbox (ordering_key, data, attrs) SELECT $2::text, $5::bytea, $6::jsonb FROM p)
SELECT payout_id, account_id, amount_minor, currency, state, fence,
       coalesce(owner_id, ''), coalesce(rail_ref, ''), coalesce(rail_token, 0), coalesce(attention_reason, ''),
       0::bigint, created_at, updated_at
FROM p`

// lockedPayout is a payout row as locked (FOR UPDATE) before a fenced
// statement.
type lockedPayout struct {
	accountID string
	amount    int64
	currency  string
	state     api.State
	fence     int64
}

// sameTerms returns nil when terms is empty or names l's account, amount
// and currency, and otherwise an error wrapping ErrTermsMismatch that
// names the fields that differ, never the payout's values (as
// termsConflict).
func (l lockedPayout) sameTerms(id string, terms api.ClaimRequest) error {
	if terms == (api.ClaimRequest{}) {
		return nil
	}
	d := differing(diff{"accountId", terms.AccountID != l.accountID}, diff{"amountMinor", terms.AmountMinor != l.amount},
		diff{"currency", terms.Currency != l.currency})
	if d == "" {
		return nil
	}
	return fmt.Errorf("%w: payout %s has a different %s", ErrTermsMismatch, id, d)
}

func lockPayout(ctx context.Context, tx pgx.Tx, id string) (lockedPayout, error) {
	var l lockedPayout
	err := tx.QueryRow(ctx, `SELECT p.account_id, p.amount_minor, p.currency, p.state, p.fence
FROM payout p WHERE p.payout_id = $1 FOR UPDATE`, id).
		Scan(&l.accountID, &l.amount, &l.currency, &l.state, &l.fence)
	if errors.Is(err, pgx.ErrNoRows) {
		return l, fmt.Errorf("%w: %q", ErrPayoutNotFound, id)
	}
	if err != nil {
		return l, dbError("lock payout", err)
	}
	return l, nil
}

// claimTx is fence point one on the payout row for the claim step
// (claim: in its span). Terms, when given, are compared with the payout
// first: before the proof (which is judged against the payout's account)
// and before the fence, so that a claim for other terms changes nothing
// whatever its token. The first claim of a pending payout with its terms
// takes one round trip (claimFast).
func (s *Service) claimTx(ctx context.Context, id string, h fencewire.Holder, terms api.ClaimRequest) (api.Payout, error) {
	token, owner := h.Token, h.Owner
	from := api.StatePending
	p, ok, err := s.claimFast(ctx, id, h, terms)
	if err != nil {
		return api.Payout{}, err
	}
	if !ok {
		if p, from, err = s.claimSlow(ctx, id, h, terms); err != nil {
			return api.Payout{}, err
		}
	}
	s.claimed.put(p)
	// The first claim is restated by the posting's line (same token): DEBUG.
	// A claim of a payout already claimed is a redelivery or a change of
	// holder, the trail the folded history leaves out: INFO.
	level := slog.LevelDebug
	if from == api.StateClaimed {
		level = slog.LevelInfo
	}
	s.log.Log(ctx, level, "payout claimed", "event", api.EventPayoutClaimed, "payoutId", id, "accountId", p.AccountID,
		"token", token, "ownerId", owner, "from", string(from))
	return p, nil
}

// claimSlow is claimTx in a transaction of several statements (the slow
// path): it answers every case claimFast does not accept, and returns the
// state the payout was claimed from.
func (s *Service) claimSlow(ctx context.Context, id string, h fencewire.Holder, terms api.ClaimRequest) (p api.Payout, from api.State, err error) {
	token, owner := h.Token, h.Owner
	err = s.inTx(ctx, "claim", func(tx pgx.Tx) error {
		l, err := lockPayout(ctx, tx, id)
		if err != nil {
			return err
		}
		if err := l.sameTerms(id, terms); err != nil {
			return err
		}
		if err := s.verifyToken(ctx, id, l, h); err != nil {
			return err
		}
		from = l.state
		if l.state != api.StateClaimed {
			// The first claim of this payout: the fenced UPDATE, its
			// history row and the read-back in one statement
			// (recordClaim's first case).
			q := claimStepFenced
			if !s.fencing {
				q = claimStepUnfenced
			}
			froms, tos := steps(l.state, api.StateClaimed)
			p, err = scanPayoutRow(tx.QueryRow(ctx, q, id, token, owner, froms, tos), id)
			if errors.Is(err, ErrPayoutNotFound) {
				return s.refused(ctx, tx, id, l, token, owner, true)
			}
			return err
		}
		q := claimFenced
		if !s.fencing {
			q = claimUnfenced
		}
		tag, err := tx.Exec(ctx, q, id, token, owner)
		if err != nil {
			return dbError("claim", err)
		}
		if tag.RowsAffected() == 0 {
			return s.refused(ctx, tx, id, l, token, owner, true)
		}
		if err := recordClaim(ctx, tx, id, l, token, owner); err != nil {
			return err
		}
		p, err = loadPayout(ctx, tx, id)
		return err
	})
	return p, from, err
}

// resultTx records the rail's answer to a submission of payout id. For ACK
// one transaction posts the payout (payout fence, non-strict), debits the
// account (account fence, strict) and writes the ledger transaction. A
// result of a claimed payout whose claim this process answered takes one
// round trip (resultFast).
func (s *Service) resultTx(ctx context.Context, id string, h fencewire.Holder, req api.ResultRequest) (api.Payout, error) {
	token, owner := h.Token, h.Owner
	var replayed bool
	from := api.StateClaimed
	completedAfter := -1.0 // seconds from creation to posted or declined; < 0: not finished here
	p, ok, err := s.resultFast(ctx, id, h, req)
	if err != nil {
		return api.Payout{}, err
	}
	if ok {
		if req.Outcome == api.OutcomeAck {
			p.Debits++ // the row was read before this debit
		}
		if req.Outcome != api.OutcomeAmbiguous {
			completedAfter = max(p.UpdatedAt.Sub(p.CreatedAt).Seconds(), 0)
		}
	}
	slow := func(tx pgx.Tx) error {
		completedAfter = -1
		// The payout row is locked and, for ACK or DECLINE, the rail
		// result recorded in one statement; a check that fails below
		// rolls the record back with the transaction.
		l, recorded, err := lockRecordingResult(ctx, tx, id, token, owner, req)
		if err != nil {
			return err
		}
		if err := s.verifyToken(ctx, id, l, h); err != nil {
			return err
		}
		if err := s.verifyReceipt(id, l, token, req); err != nil {
			return err
		}
		from = l.state
		if req.Outcome != api.OutcomeAmbiguous {
			if !recorded {
				replayed, err = recordedRailResult(ctx, tx, id, req)
				if err != nil {
					return err
				}
			}
			if replayed {
				p, err = loadPayout(ctx, tx, id)
				return err
			}
		}
		// The payout row goes first: a holder whose token the payout has
		// already seen but whose payout is finished must learn
		// PAYOUT_FINISHED, not the account fence's refusal of its token.
		// One statement writes the step, the rail token and the history
		// rows, and reads the payout back.
		var fenced, unfenced string
		var froms, tos []string
		switch req.Outcome {
		case api.OutcomeAck:
			fenced, unfenced = postStepFenced, postStepUnfenced
			froms, tos = steps(l.state, api.StateAcknowledged, api.StatePosted)
		case api.OutcomeDecline:
			fenced, unfenced = declineStepFenced, declineStepUnfenced
			froms, tos = steps(l.state, api.StateDeclined)
		default:
			fenced, unfenced = ambiguousStepFenced, ambiguousStepUnfenced
			froms, tos = steps(l.state, api.StateAmbiguous)
		}
		q := fenced
		if !s.fencing {
			q = unfenced
		}
		p, err = scanPayoutRow(tx.QueryRow(ctx, q, id, token, owner, req.RailRef, railToken(req, token), froms, tos), id)
		if errors.Is(err, ErrPayoutNotFound) {
			return s.refused(ctx, tx, id, l, token, owner, false)
		}
		if err != nil {
			return err
		}
		if req.Outcome == api.OutcomeAck {
			// The account's fence decides the debit: its own statement,
			// after the payout's; a refusal rolls the step back.
			if err := s.debit(ctx, tx, id, l, token, owner, req.RailRef); err != nil {
				return err
			}
			p.Debits++ // the row was read before this debit
		}
		if req.Outcome != api.OutcomeAmbiguous && l.state != api.StatePosted && l.state != api.StateDeclined {
			// From creation to posted or declined, by paydb's clock.
			completedAfter = max(p.UpdatedAt.Sub(p.CreatedAt).Seconds(), 0)
		}
		return nil
	}
	if !ok {
		if err := s.inTx(ctx, "result", slow); err != nil {
			return api.Payout{}, err
		}
	}
	s.claimed.forget(id) // a payout with a result is never claimed again: no fast result of it can follow
	if completedAfter >= 0 {
		completion.Observe(completedAfter)
	}
	attrs := []any{"payoutId", id, "accountId", p.AccountID, "token", token, "ownerId", owner,
		"railRef", req.RailRef, "from", string(from)}
	switch {
	case replayed:
		s.log.InfoContext(ctx, "rail result already recorded", append([]any{"event", api.EventResultReplayed, "outcome", string(req.Outcome)}, attrs...)...)
	case req.Outcome == api.OutcomeAck:
		level := slog.LevelInfo
		if p.Debits > 1 {
			level = slog.LevelWarn // only possible with fencing off
		}
		s.log.Log(ctx, level, "payout posted",
			append([]any{"event", api.EventPayoutPosted, "amountMinor", p.AmountMinor, "currency", p.Currency, "debits", p.Debits}, attrs...)...)
	case req.Outcome == api.OutcomeDecline:
		s.log.InfoContext(ctx, "payout declined", append([]any{"event", api.EventPayoutDeclined}, attrs...)...)
	default:
		s.log.WarnContext(ctx, "payout outcome ambiguous", append([]any{"event", api.EventPayoutAmbiguous}, attrs...)...)
	}
	return p, nil
}

// lockRecordingResult is lockPayout and, for an ACK or DECLINE, the
// record of the fact (railRef, payout, outcome) in rail_result, in one
// statement: recorded says whether the fact was inserted (false when the
// reference is already recorded: recordedRailResult says by whom).
// Concurrent callers with one reference serialise on its key.
func lockRecordingResult(ctx context.Context, tx pgx.Tx, id string, token int64, owner string, req api.ResultRequest) (l lockedPayout, recorded bool, err error) {
	err = tx.QueryRow(ctx, `WITH l AS (SELECT p.account_id, p.amount_minor, p.currency, p.state, p.fence
  FROM payout p WHERE p.payout_id = $1 FOR UPDATE),
r AS (INSERT INTO rail_result (rail_ref, payout_id, outcome, token, owner_id, rail_token)
  SELECT $2, $1, $3, $4, NULLIF($5, ''), $6 FROM l WHERE $3 <> 'AMBIGUOUS'
  ON CONFLICT (rail_ref) DO NOTHING RETURNING 1)
SELECT l.account_id, l.amount_minor, l.currency, l.state, l.fence, EXISTS (SELECT 1 FROM r) FROM l`,
		id, req.RailRef, string(req.Outcome), token, owner, railToken(req, token)).
		Scan(&l.accountID, &l.amount, &l.currency, &l.state, &l.fence, &recorded)
	if errors.Is(err, pgx.ErrNoRows) {
		return l, false, fmt.Errorf("%w: %q", ErrPayoutNotFound, id)
	}
	if err != nil {
		return l, false, dbError("lock payout and record rail result", err)
	}
	return l, recorded, nil
}

// recordedRailResult reads who recorded rail reference req.RailRef: it
// reports replayed=true when it is exactly this fact (payout id, the same
// outcome), and ErrRailRefConflict when it is another payout or outcome.
func recordedRailResult(ctx context.Context, tx pgx.Tx, id string, req api.ResultRequest) (replayed bool, err error) {
	var gotPayout, gotOutcome string
	if err := tx.QueryRow(ctx, `SELECT payout_id, outcome FROM rail_result WHERE rail_ref = $1`, req.RailRef).
		Scan(&gotPayout, &gotOutcome); err != nil {
		return false, dbError("read rail result", err)
	}
	if gotPayout != id || gotOutcome != string(req.Outcome) {
		return false, fmt.Errorf("%w: rail reference %q is recorded as %s of payout %s", ErrRailRefConflict, req.RailRef, gotOutcome, gotPayout)
	}
	return true, nil
}

// railToken is the token the reported submission reached the rail with:
// req.RailToken, or the reporter's token when it is not given.
func railToken(req api.ResultRequest, token int64) int64 {
	if req.RailToken > 0 {
		return req.RailToken
	}
	return token
}

// debit is fence point one on the account row: the strict, fenced debit
// and, in the same statement (withLedger), the ledger transaction
// (account:{id} -amount, rail:clearing +amount).
func (s *Service) debit(ctx context.Context, tx pgx.Tx, id string, l lockedPayout, token int64, owner, railRef string) error {
	q := debitFenced
	if !s.fencing {
		q = debitUnfenced
	}
	tag, err := tx.Exec(ctx, withLedger(q), l.accountID, l.amount, token, l.currency,
		id, kindPayoutDebit, railRef, ledgerAccountPrefix+l.accountID, ledgerRailClearing)
	if err != nil {
		return dbError("debit", err)
	}
	if tag.RowsAffected() == 0 {
		highest, err := accountFence(ctx, tx, l.accountID)
		if err != nil {
			return dbError("debit: read account fence", err)
		}
		if !s.fencing || highest < token {
			return fmt.Errorf("paymentresource: debit of account %s matched no row (currency %s)", l.accountID, l.currency)
		}
		return s.fencedOut(ctx, fencing.Refusal{Resource: "account", ResourceID: l.accountID, PresentedToken: token, HighestToken: highest, Owner: owner},
			id, l.accountID)
	}
	return nil
}

// accountFence reads account id's fence as committed now (not locked).
func accountFence(ctx context.Context, tx pgx.Tx, id string) (int64, error) {
	var fence int64
	err := tx.QueryRow(ctx, `SELECT fence FROM account WHERE account_id = $1`, id).Scan(&fence)
	return fence, err
}

// withLedger wraps a debit statement (debitFenced or debitUnfenced,
// parameters $1-$4) so that the ledger transaction of the debit (one
// ledger_txn row for payout $5, kind $6, rail reference $7, token $3; two
// ledger_entry rows: ledger account $8 -amount, $9 +amount) is written by
// the same statement, and only for the account row the debit matched: one
// round trip instead of three, and a refused debit can write no ledger row
// at all. It affects two rows (the entries) when the debit matched, none
// when the fence refused it.
func withLedger(debit string) string {
	return `WITH d AS (` + debit + `
  RETURNING account_id),
t AS (INSERT INTO ledger_txn (payout_id, kind, rail_ref, token) SELECT $5, $6, $7, $3 FROM d RETURNING txn_id)
INSERT INTO ledger_entry (txn_id, ledger_account, amount_minor, currency)
SELECT t.txn_id, e.ledger_account, e.amount_minor, $4 FROM t, (VALUES ($8::text, -$2::bigint), ($9::text, $2::bigint)) AS e (ledger_account, amount_minor)`
}

// recordClaim writes the history of an accepted claim: nothing when the
// payout was already claimed with this token (the same grant asking again
// changes nothing), a row folded into the last one when it is a re-claim
// following a re-claim (coalesceReclaim), a new row otherwise. A payout's
// history therefore holds at most one claimed -> claimed row in a row,
// however often it is redelivered.
func recordClaim(ctx context.Context, tx pgx.Tx, id string, l lockedPayout, token int64, owner string) error {
	if l.state != api.StateClaimed {
		return transition(ctx, tx, id, l.state, api.StateClaimed, token, owner)
	}
	if l.fence == token {
		return nil
	}
	tag, err := tx.Exec(ctx, coalesceReclaim, id, token, owner)
	if err != nil {
		return dbError("claim: coalesce history", err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	return transition(ctx, tx, id, l.state, api.StateClaimed, token, owner)
}

// refused explains why a fenced payout statement matched no row, from the
// payout row as locked before it and the account's fence read now (the
// statement saw a debit committed after the lock, and a fence only grows).
// In order: for a claim, a payout no claim can take (finished, in doubt,
// needs attention) whatever the token, so a fence raised by a bad token
// never turns "done" into a refusal redelivered forever; then a higher
// fence (FENCED_OUT, logged); then a state the step does not start from.
func (s *Service) refused(ctx context.Context, tx pgx.Tx, id string, l lockedPayout, token int64, owner string, claim bool) error {
	var account int64 // the account's fence now, when it can explain
	if s.fencing && l.fence <= token {
		var err error
		if account, err = accountFence(ctx, tx, l.accountID); err != nil {
			return dbError("refusal: read account fence", err)
		}
	}
	switch {
	case claim && (l.state == api.StatePosted || l.state == api.StateDeclined || l.state == api.StateFailed):
		return fmt.Errorf("%w: payout %s is %s", ErrPayoutFinished, id, l.state)
	case claim && l.state == api.StateNeedsAttention:
		return fmt.Errorf("%w: payout %s", ErrPayoutNeedsAttention, id)
	case claim && (l.state == api.StateAmbiguous || l.state == api.StateSubmitted || l.state == api.StateAcknowledged):
		return fmt.Errorf("%w: payout %s is %s", ErrPayoutInDoubt, id, l.state)
	case s.fencing && l.fence > token:
		return s.fencedOut(ctx, fencing.Refusal{Resource: "payout", ResourceID: id, PresentedToken: token, HighestToken: l.fence, Owner: owner},
			id, l.accountID)
	case s.fencing && account > token:
		// A newer holder of the account's lock has debited: this token is
		// stale for every payout of the account, even one nobody has
		// touched since (its own fence is still low).
		return s.fencedOut(ctx, fencing.Refusal{Resource: "account", ResourceID: l.accountID, PresentedToken: token, HighestToken: account, Owner: owner},
			id, l.accountID)
	}
	switch l.state {
	case api.StatePosted, api.StateDeclined, api.StateFailed:
		return fmt.Errorf("%w: payout %s is %s", ErrPayoutFinished, id, l.state)
	case api.StateAmbiguous, api.StateSubmitted, api.StateAcknowledged:
		return fmt.Errorf("%w: payout %s is %s", ErrPayoutInDoubt, id, l.state)
	case api.StateNeedsAttention:
		return fmt.Errorf("%w: payout %s", ErrPayoutNeedsAttention, id)
	case api.StatePending:
		return fmt.Errorf("%w: payout %s is pending; claim it first", ErrPayoutNotClaimed, id)
	}
	return fmt.Errorf("paymentresource: payout %s in state %s (fence %d) matched no row for token %d", id, l.state, l.fence, token)
}

// attentionTx marks payout id needs_attention for the lock holder with
// token, with reason (fenced on the payout row, non-strict). A payout
// already in needs_attention is returned unchanged (the first reason
// stays), so that a holder may send the request again after a lost
// answer. Like every write of a holder, the token must carry lock-server's
// proof for payout:{account}. It returns ErrUnverifiedToken,
// ErrPayoutFinished, ErrFencedOut, ErrPayoutNotFound.
func (s *Service) attentionTx(ctx context.Context, id string, h fencewire.Holder, reason api.AttentionReason) (api.Payout, error) {
	token, owner := h.Token, h.Owner
	var p api.Payout
	var from api.State
	var changed bool
	err := s.inTx(ctx, "attention", func(tx pgx.Tx) error {
		l, err := lockPayout(ctx, tx, id)
		if err != nil {
			return err
		}
		if err := s.verifyToken(ctx, id, l, h); err != nil {
			return err
		}
		from = l.state
		if l.state == api.StateNeedsAttention && (!s.fencing || l.fence <= token) {
			p, err = loadPayout(ctx, tx, id)
			return err
		}
		q := attentionFenced
		if !s.fencing {
			q = attentionUnfenced
		}
		tag, err := tx.Exec(ctx, q, id, token, owner, string(reason))
		if err != nil {
			return dbError("attention", err)
		}
		if tag.RowsAffected() == 0 {
			return s.refused(ctx, tx, id, l, token, owner, false)
		}
		if err := insertTransition(ctx, tx, id, l.state, api.StateNeedsAttention, token, owner, reason); err != nil {
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
		needingAttention.WithLabelValues(string(reason)).Inc()
		s.log.ErrorContext(ctx, "payout needs attention: a refusal no retry can change", "event", api.EventPayoutNeedsAttention,
			"payoutId", id, "accountId", p.AccountID, "token", token, "ownerId", owner, "reason", string(reason), "from", string(from))
	}
	return p, nil
}

// verifyToken checks, while fencing is on, that lock-server granted the
// holder's token on the lock that guards the payout's account
// (payout:{account}): a token it did not issue there must not write the
// payout or move the account's fence. It returns nil or
// ErrUnverifiedToken, logged.
func (s *Service) verifyToken(ctx context.Context, id string, l lockedPayout, h fencewire.Holder) error {
	if !s.fencing {
		return nil
	}
	err := fencing.Verify(s.proofKeys, h.Proof, payoutevent.Event{AccountID: l.accountID}.LockKey(), h.Token)
	if err != nil {
		fencing.LogUnverified(ctx, s.log, "account", l.accountID, h.Token, h.Owner, err, "payoutId", id, "accountId", l.accountID)
		return fmt.Errorf("%w: %w", ErrUnverifiedToken, err)
	}
	return nil
}

// verifyReceipt checks that an ACK or DECLINE carries rail-proxy's
// receipt over exactly this payout's account, amount and currency and the
// reported outcome, rail reference and rail token: a holder cannot record
// an answer the rail did not give to this payout. AMBIGUOUS moves no money
// and needs none. It returns nil or ErrInvalidReceipt.
func (s *Service) verifyReceipt(id string, l lockedPayout, token int64, req api.ResultRequest) error {
	if req.Outcome == api.OutcomeAmbiguous {
		return nil
	}
	rec := fencewire.RailReceipt{PayoutID: id, AccountID: l.accountID, AmountMinor: l.amount, Currency: l.currency,
		Outcome: string(req.Outcome), RailRef: req.RailRef, RailToken: railToken(req, token)}
	if err := s.checkReceipt(req.Receipt, rec); err != nil {
		return fmt.Errorf("%w: %s %s with rail reference %q and rail token %d: %w", ErrInvalidReceipt,
			req.Outcome, id, req.RailRef, rec.RailToken, err)
	}
	return nil
}

// errNoReceipt: a result that needs rail-proxy's receipt came without
// one. Said as such: fenceproof's own error for an empty value names a
// proof, which is another header.
var errNoReceipt = errors.New("no receipt")

// checkReceipt verifies receipt as rail-proxy's signature over rec.
func (s *Service) checkReceipt(receipt string, rec fencewire.RailReceipt) error {
	if receipt == "" {
		return errNoReceipt
	}
	_, err := s.receipts.Verify(receipt, fencewire.RailReceiptDomain, rec.Fields()...)
	return err
}

// fencedOut logs the fenced_out event and returns the error wrapping
// ErrFencedOut.
func (s *Service) fencedOut(ctx context.Context, r fencing.Refusal, payoutID, accountID string) error {
	r.Log(ctx, s.log, "payoutId", payoutID, "accountId", accountID)
	return fencedOutError{msg: fmt.Errorf("%w: %s %s has accepted token %d; token %d is stale", ErrFencedOut,
		r.Resource, r.ResourceID, r.HighestToken, r.PresentedToken), refusal: r}
}

// fencedOutError is ErrFencedOut's error with its fencing.Refusal in the
// chain (errors.As), for the fence span; its text is msg's.
type fencedOutError struct {
	msg     error
	refusal fencing.Refusal
}

func (e fencedOutError) Error() string   { return e.msg.Error() }
func (e fencedOutError) Unwrap() []error { return []error{e.msg, e.refusal} }

// transition appends one row to the payout's history; from "" and token 0
// record the creation.
func transition(ctx context.Context, tx pgx.Tx, id string, from, to api.State, token int64, owner string) error {
	return insertTransition(ctx, tx, id, from, to, token, owner, "")
}

// insertTransition is transition with the reason of a change into
// needs_attention. The history row and the payout's updated_at (and, for
// the creation, its created_at) take one time, the row's at
// (clock_timestamp()), in one statement: a payout's updatedAt is always
// its last history row's time, never earlier. The fenced UPDATEs
// therefore leave updated_at alone.
func insertTransition(ctx context.Context, tx pgx.Tx, id string, from, to api.State, token int64, owner string, reason api.AttentionReason) error {
	if _, err := tx.Exec(ctx, insertTransitionSQL, id, string(from), string(to), token, owner, string(reason)); err != nil {
		return dbError("record transition", err)
	}
	return nil
}

// insertTransitionSQL is insertTransition's statement.
const insertTransitionSQL = `WITH t AS (
  INSERT INTO payout_transition (payout_id, from_state, to_state, token, owner_id, reason)
  VALUES ($1, NULLIF($2, ''), $3, NULLIF($4::bigint, 0), NULLIF($5, ''), NULLIF($6, ''))
  RETURNING at, from_state)
UPDATE payout SET updated_at = t.at, created_at = CASE WHEN t.from_state IS NULL THEN t.at ELSE payout.created_at END
FROM t WHERE payout.payout_id = $1`

// payout returns the payout without its history, or ErrPayoutNotFound.
func (s *Service) payout(ctx context.Context, id string) (api.Payout, error) {
	return loadPayout(ctx, s.pool, id)
}

// loadPayout reads the payout without its history (one statement).
func loadPayout(ctx context.Context, q querier, id string) (api.Payout, error) {
	return scanPayoutRow(q.QueryRow(ctx, payoutRowSQL, id), id)
}

// payoutRowSQL and payoutHistorySQL read a payout and its history
// (loadPayout, history).
const (
	payoutRowSQL = `SELECT payout_id, account_id, amount_minor, currency, state, fence,
       coalesce(owner_id, ''), coalesce(rail_ref, ''), coalesce(rail_token, 0), coalesce(attention_reason, ''),
       (SELECT count(*) FROM ledger_txn t WHERE t.payout_id = p.payout_id AND t.kind = 'payout_debit'),
       created_at, updated_at
FROM payout p WHERE payout_id = $1`
	payoutHistorySQL = `SELECT coalesce(from_state, ''), to_state, coalesce(token, 0), coalesce(owner_id, ''),
       coalesce(reason, ''), claims, at
FROM payout_transition WHERE payout_id = $1 ORDER BY transition_id`
)

// scanPayoutRow scans payoutRowSQL's row of payout id.
func scanPayoutRow(row pgx.Row, id string) (api.Payout, error) {
	var p api.Payout
	err := row.Scan(&p.PayoutID, &p.AccountID, &p.AmountMinor, &p.Currency, &p.State, &p.Fence,
		&p.OwnerID, &p.RailRef, &p.RailToken, &p.AttentionReason, &p.Debits, &p.CreatedAt, &p.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return api.Payout{}, fmt.Errorf("%w: %q", ErrPayoutNotFound, id)
	}
	if err != nil {
		return api.Payout{}, dbError("read payout", err)
	}
	p.CreatedAt, p.UpdatedAt = p.CreatedAt.UTC(), p.UpdatedAt.UTC()
	return p, nil
}

// history reads payout id's history, oldest first (never nil for a
// payout that exists: its creation is the first row). Only an answer
// that asked for it (api.QueryInclude) reads it.
func (s *Service) history(ctx context.Context, id string) ([]api.Transition, error) {
	rows, err := s.pool.Query(ctx, payoutHistorySQL, id)
	if err != nil {
		return nil, dbError("read payout history", err)
	}
	h, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (api.Transition, error) {
		var t api.Transition
		err := r.Scan(&t.From, &t.To, &t.Token, &t.OwnerID, &t.Reason, &t.Claims, &t.At)
		t.At = t.At.UTC()
		if t.From != api.StateClaimed || t.To != api.StateClaimed {
			t.Claims = 0 // only a re-claim row counts claims
		}
		return t, err
	})
	if err != nil {
		return nil, dbError("read payout history", err)
	}
	return h, nil
}
