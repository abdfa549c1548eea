package railproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/iso4217"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
	"github.com/jackc/pgx/v5"
)

// Reconciliation resolves the payout's forwarded attempt (rail_payout)
// against the rail. Acked or declined: that is the answer. Forwarding or
// ambiguous, and older than the abandon threshold (abandonAfter; before it,
// ATTEMPT_IN_FLIGHT): rail-proxy puts a stop order on the payout's
// reference at the rail, so that "the rail has nothing" stays true even if
// the original call arrives later, and records what the rail holds, only
// if the attempt is still in the state read. See "The reconciler" in
// docs/payout-pipeline.md.

// sqlReconcileAttempt records a reconciliation's outcome, only if the
// attempt is still in the state the reconciliation read.
const sqlReconcileAttempt = `
UPDATE rail_attempt
   SET state = $3, rail_ref = NULLIF($4, ''), finished_at = now()
 WHERE attempt_id = $1 AND state = $2`

// sqlPayoutAttempt reads the payout's forwarded attempt without locking
// it, with its age judged on raildb's clock.
const sqlPayoutAttempt = `
SELECT a.attempt_id, a.payout_id, a.account_id, a.amount_minor, a.currency, a.token, a.owner_id, a.state,
       COALESCE(a.rail_ref, ''), a.created_at, a.finished_at,
       a.created_at < now() - $2::bigint * interval '1 millisecond'
  FROM rail_payout p JOIN rail_attempt a USING (attempt_id)
 WHERE p.payout_id = $1`

func (p *Proxy) handleReconcile(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		p.methodNotAllowed(w, r, http.MethodPost)
		return
	}
	if !p.noQuery(w, r) {
		return
	}
	h, ok := p.holder(w, r)
	if !ok {
		return
	}
	var req api.ReconcileRequest
	if err := jsonhandler.Decode(w, r, &req, api.MaxBodyBytes); err != nil {
		p.fail(r.Context(), w, p.log, err)
		return
	}
	err := req.Validate()
	if err == nil && req.HasPayout() {
		err = iso4217.Check(req.Currency)
	}
	if err == nil {
		req.TermsSignature, err = termsSignature(r, req.BodyTermsSignature)
	}
	if errors.Is(err, ErrInvalidRequest) {
		p.fail(r.Context(), w, p.log, err)
		return
	}
	if err != nil {
		p.fail(r.Context(), w, p.log, fmt.Errorf("%w: %v", ErrInvalidRequest, err))
		return
	}
	if !p.cfg.FencingDisabled {
		// The proof's shape (present, well formed) needs no key and no
		// raildb, so a missing or malformed one is the caller's 403 even
		// while raildb is stalled; its signature is verified in reconcile,
		// against the lock of the attempt's account, which is in raildb.
		if err := fencing.CheckProof(h.Proof); err != nil {
			fencing.LogUnverified(r.Context(), p.log, "rail", "", h.Token, h.Owner, err, "payoutId", req.PayoutID)
			p.fail(r.Context(), w, p.log, fmt.Errorf("%w: %w", ErrUnverifiedToken, err))
			return
		}
	}
	release, shed := p.begin(w, r)
	if shed != nil {
		return
	}
	defer release()
	lg := p.log.With("payoutId", req.PayoutID, "token", h.Token, "ownerId", h.Owner)
	rec, err := p.reconcile(r.Context(), req.PayoutID, h, lg)
	if errors.Is(err, ErrNotForwarded) && req.HasPayout() {
		rec, err = p.closePayout(r.Context(), req, h, lg)
	}
	if err != nil {
		p.fail(r.Context(), w, lg, fmt.Errorf("%w: %w", errReconciling, err))
		return
	}
	jsonhandler.WriteJSON(w, http.StatusOK, rec)
}

// reconcile resolves payout's forwarded attempt for the holder h of the
// payout's lease (its token and proof are verified against
// payout:{account} of the attempt while fencing is on). It returns the
// Reconciliation, or an error wrapping ErrNotForwarded, ErrInFlight,
// ErrRailSubmittedTwice, ErrUnverifiedToken or ErrUnavailable.
func (p *Proxy) reconcile(ctx context.Context, payout string, h fencewire.Holder, lg *slog.Logger) (api.Reconciliation, error) {
	a, old, err := p.payoutAttempt(ctx, payout)
	if err != nil {
		return api.Reconciliation{}, err
	}
	if !p.cfg.FencingDisabled {
		key := payoutevent.Event{AccountID: a.AccountID}.LockKey()
		if err := fencing.Verify(p.cfg.ProofKeys, h.Proof, key, h.Token); err != nil {
			fencing.LogUnverified(ctx, p.log, "rail", a.AccountID, h.Token, h.Owner, err, "payoutId", payout, "accountId", a.AccountID)
			return api.Reconciliation{}, fmt.Errorf("%w: %w", ErrUnverifiedToken, err)
		}
	}
	lg = lg.With("accountId", a.AccountID, "attemptId", a.AttemptID, "attemptToken", a.Token)
	switch a.State {
	case api.StateAcked, api.StateDeclined, api.StateNotAtRail:
		return p.reconciliation(a, false), nil
	case api.StateForwarding, api.StateAmbiguous:
	default:
		return api.Reconciliation{}, fmt.Errorf("railproxy: payout %s: forwarded attempt %d in state %s", payout, a.AttemptID, a.State)
	}
	if !old {
		return api.Reconciliation{}, fmt.Errorf("%w: attempt %d of payout %s is %s and younger than %v", ErrInFlight,
			a.AttemptID, payout, a.State, p.abandonAfter())
	}
	return p.settleAtRail(ctx, a, lg)
}

// settleAtRail puts the stop order on the reference of a's payout at the
// rail and records what the rail holds as a's outcome, guarded by a's
// state as read (a forwarding or ambiguous attempt, the payout's forward).
func (p *Proxy) settleAtRail(ctx context.Context, a api.Attempt, lg *slog.Logger) (api.Reconciliation, error) {
	payout := a.PayoutID
	records, err := p.stopAtRail(ctx, payout)
	if err != nil {
		return api.Reconciliation{}, err
	}
	state, railRef := api.StateNotAtRail, ""
	switch len(records) {
	case 0:
	case 1:
		switch records[0].Answer.Status {
		case rail.StatusAck:
			state = api.StateAcked
		case rail.StatusDecline:
			state = api.StateDeclined
		default:
			return api.Reconciliation{}, fmt.Errorf("%w: the rail's record of payout %s has status %q", ErrUnavailable, payout, records[0].Answer.Status)
		}
		railRef = records[0].Answer.RailRef
		if railRef == "" || len(railRef) > api.MaxRailRefLen {
			return api.Reconciliation{}, fmt.Errorf("%w: the rail's record of payout %s has no usable reference", ErrUnavailable, payout)
		}
	default:
		refs := make([]string, 0, len(records))
		for _, r := range records {
			refs = append(refs, r.Answer.RailRef)
		}
		lg.ErrorContext(ctx, "the rail holds more than one submission of this payout: a safety violation (INV-04); not resolving it",
			"event", api.EventRailSubmittedTwice, "count", len(records), "railRefs", refs)
		return api.Reconciliation{}, fmt.Errorf("%w: %d submissions of payout %s (%v)", ErrRailSubmittedTwice, len(records), payout, refs)
	}
	dctx, done := p.dbCall(ctx)
	tag, err := p.pool.Exec(dctx, sqlReconcileAttempt, a.AttemptID, a.State, state, railRef)
	if err != nil {
		err = dbError("record reconciliation", err)
	}
	done(err)
	if err != nil {
		return api.Reconciliation{}, err
	}
	if tag.RowsAffected() == 0 {
		// Recorded meanwhile (by the original forward, or another
		// reconciliation): answer what is recorded now.
		now, _, err := p.payoutAttempt(ctx, payout)
		if err != nil {
			return api.Reconciliation{}, err
		}
		if now.State == api.StateForwarding || now.State == api.StateAmbiguous {
			return api.Reconciliation{}, fmt.Errorf("%w: attempt %d of payout %s changed while being reconciled", ErrUnavailable, a.AttemptID, payout)
		}
		return p.reconciliation(now, false), nil
	}
	lg.WarnContext(ctx, "forwarded attempt resolved against the rail's record", "event", api.EventAttemptReconciled,
		"previousState", a.State, "state", state, "railRef", railRef)
	a.State, a.RailRef = state, railRef
	return p.reconciliation(a, true), nil
}

// sqlCloseAttempt records the attempt that closes a payout rail-proxy
// never forwarded: the reconciliation's token and owner, recorded
// 'ambiguous' (its outcome is the rail's answer to the stop order that
// follows) and made the payout's forward in the same transaction.
const sqlCloseAttempt = `
INSERT INTO rail_attempt (payout_id, account_id, token, owner_id, amount_minor, currency, state, finished_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, now())
RETURNING attempt_id, created_at`

// closePayout closes a payout that has no forwarded attempt (req carries
// its facts, as payment-resource holds them), for the holder h of
// payout:{req.AccountID} (verified while fencing is on): in one
// transaction, after the restore guard (ErrRestored, nothing recorded)
// and the account's fence (a token below the high-water or at or below
// the token floor: ErrFencedOut, only a 'fenced' audit row recorded), it
// records an attempt of h's token, 'ambiguous', as the
// payout's forward, so that every later submission of the payout is
// refused PAYOUT_ALREADY_SUBMITTED by rail-proxy itself; then it puts the
// stop order on the payout's reference at the rail and records what the
// rail holds (nothing: not_at_rail, normally). When a submission took the
// payout's forward first, the payout is reconciled as forwarded. When the
// stop order gets no answer, the closing attempt stays ambiguous and a
// later reconciliation (past the abandon threshold) sends it again.
func (p *Proxy) closePayout(ctx context.Context, req api.ReconcileRequest, h fencewire.Holder, lg *slog.Logger) (api.Reconciliation, error) {
	// The facts must be the payout's as payment-resource created it,
	// checked as a submission's terms are, before anything is recorded.
	if err := p.verifyTerms(ctx, api.SubmitRequest(req), h); err != nil {
		return api.Reconciliation{}, err
	}
	if !p.cfg.FencingDisabled {
		key := payoutevent.Event{AccountID: req.AccountID}.LockKey()
		if err := fencing.Verify(p.cfg.ProofKeys, h.Proof, key, h.Token); err != nil {
			fencing.LogUnverified(ctx, p.log, "rail", req.AccountID, h.Token, h.Owner, err, "payoutId", req.PayoutID, "accountId", req.AccountID)
			return api.Reconciliation{}, fmt.Errorf("%w: %w", ErrUnverifiedToken, err)
		}
	}
	a := api.Attempt{PayoutID: req.PayoutID, AccountID: req.AccountID, AmountMinor: req.AmountMinor, Currency: req.Currency,
		Token: h.Token, OwnerID: h.Owner, State: api.StateAmbiguous}
	claimed := false
	var refusal *fencing.Refusal
	dctx, done := p.dbCall(ctx)
	err := pgx.BeginFunc(dctx, p.pool, func(tx pgx.Tx) error {
		// The restore guard, as for a submission: on a restored raildb
		// "no forward" may be the backup's, and the attempt id the
		// restored sequence hands out may have named another attempt.
		var floor int64
		if err := tx.QueryRow(dctx, checkIdentitySQL).Scan(&floor); err != nil {
			return restored(err)
		}
		// The account's fence, as for a submission: a closing takes the
		// payout's forward, so a stale holder must not take it from a
		// newer one (it would fail a payout the live holder is about to
		// submit). The newest holder may close (its token equal to the
		// high-water: a close moves no money, so the strict rule's
		// one-grant-one-payout does not apply), and raises the high-water
		// when its token is newer.
		var err error
		refusal, err = closeFence(dctx, tx, a, floor, p.cfg.FencingDisabled)
		if err != nil || refusal != nil {
			return err
		}
		if err := tx.QueryRow(dctx, sqlCloseAttempt, a.PayoutID, a.AccountID, a.Token, a.OwnerID, a.AmountMinor, a.Currency, a.State).
			Scan(&a.AttemptID, &a.CreatedAt); err != nil {
			return err
		}
		tag, err := tx.Exec(dctx, sqlClaimPayout, a.PayoutID, a.AttemptID)
		if err != nil {
			return err
		}
		if claimed = tag.RowsAffected() == 1; !claimed {
			return errRollback
		}
		return nil
	})
	if errors.Is(err, errRollback) {
		err = nil
	}
	if err != nil && !errors.Is(err, ErrRestored) {
		err = dbError("close payout", err)
	}
	done(err)
	if err != nil {
		return api.Reconciliation{}, err
	}
	if refusal != nil {
		refusal.Log(ctx, p.log, "payoutId", a.PayoutID, "accountId", a.AccountID, "token", a.Token)
		return api.Reconciliation{}, fmt.Errorf("%w: closing payout %s: %w", ErrFencedOut, a.PayoutID, *refusal)
	}
	if !claimed {
		// A submission took the payout's forward meanwhile.
		return p.reconcile(ctx, req.PayoutID, h, lg)
	}
	a.CreatedAt = a.CreatedAt.UTC()
	lg = lg.With("accountId", a.AccountID, "attemptId", a.AttemptID)
	lg.WarnContext(ctx, "payout never forwarded: closed (its later submissions are refused), stopping its reference at the rail",
		"event", api.EventPayoutClosed)
	return p.settleAtRail(ctx, a, lg)
}

// sqlAdvanceClose is the closing's fence: the account's high-water is
// raised to the token, or stays when it equals the token; zero rows when
// the high-water is greater (the token is stale). It locks the account's
// row like a submission's fence, so closings and submissions of one
// account are serialised.
const sqlAdvanceClose = `
INSERT INTO rail_high_water (account_id, high_water, updated_at)
VALUES ($1, $2, now())
ON CONFLICT (account_id) DO UPDATE
   SET high_water = EXCLUDED.high_water, updated_at = now()
 WHERE rail_high_water.high_water <= EXCLUDED.high_water
RETURNING high_water`

// closeFence runs the closing's fence inside its transaction: a token at
// or below the restore's token floor, or below the account's high-water,
// is refused (a fencing.Refusal, with a 'fenced' audit row committed by
// the caller's transaction). With fencing disabled the high-water only
// grows. It returns a nil Refusal when the closing may go on.
func closeFence(ctx context.Context, tx pgx.Tx, a api.Attempt, floor int64, disabled bool) (*fencing.Refusal, error) {
	if disabled {
		var hw int64
		if err := tx.QueryRow(ctx, sqlAdvanceUnfenced, a.AccountID, a.Token).Scan(&hw); err != nil {
			return nil, fmt.Errorf("advance high-water: %w", err)
		}
		return nil, nil
	}
	var hw int64
	err := pgx.ErrNoRows
	if a.Token > floor {
		err = tx.QueryRow(ctx, sqlAdvanceClose, a.AccountID, a.Token).Scan(&hw)
	}
	switch {
	case err == nil:
		return nil, nil
	case !errors.Is(err, pgx.ErrNoRows):
		return nil, fmt.Errorf("advance high-water: %w", err)
	}
	if err := tx.QueryRow(ctx, sqlHighWater, a.AccountID).Scan(&hw); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("read high-water: %w", err)
	}
	if err := tx.QueryRow(ctx, sqlInsertAttempt, a.PayoutID, a.AccountID, a.Token, a.OwnerID,
		a.AmountMinor, a.Currency, api.StateFenced).Scan(new(int64)); err != nil {
		return nil, fmt.Errorf("record attempt: %w", err)
	}
	return &fencing.Refusal{Resource: "rail", ResourceID: a.AccountID, PresentedToken: a.Token, HighestToken: max(hw, floor), Owner: a.OwnerID}, nil
}

// errRollback ends a transaction that must not commit, without a failure.
var errRollback = errors.New("railproxy: rolled back")

// reconciliation is the answer for an attempt whose outcome is recorded.
func (p *Proxy) reconciliation(a api.Attempt, resolved bool) api.Reconciliation {
	outcome := api.RailNone
	switch a.State {
	case api.StateAcked:
		outcome = api.RailAck
	case api.StateDeclined:
		outcome = api.RailDecline
	}
	a.Receipt = p.receipt(a.PayoutID, a.AccountID, a.AmountMinor, a.Currency, a.State, a.RailRef, a.Token)
	return api.Reconciliation{Outcome: outcome, RailRef: a.RailRef, RailToken: a.Token, Resolved: resolved, Attempt: a, Receipt: a.Receipt}
}

// payoutAttempt reads the payout's forwarded attempt and whether it is
// older than the abandon threshold; ErrNotForwarded when there is none.
func (p *Proxy) payoutAttempt(ctx context.Context, payout string) (_ api.Attempt, _ bool, err error) {
	ctx, done := p.dbCall(ctx)
	defer func() { done(err) }()
	var (
		a   api.Attempt
		old bool
	)
	err = p.pool.QueryRow(ctx, sqlPayoutAttempt, payout, p.abandonAfter().Milliseconds()).Scan(
		&a.AttemptID, &a.PayoutID, &a.AccountID, &a.AmountMinor, &a.Currency, &a.Token,
		&a.OwnerID, &a.State, &a.RailRef, &a.CreatedAt, &a.FinishedAt, &old)
	if errors.Is(err, pgx.ErrNoRows) {
		return a, false, fmt.Errorf("%w: payout %s has no forwarded attempt", ErrNotForwarded, payout)
	}
	if err != nil {
		return a, false, dbError("read forwarded attempt", err)
	}
	a.CreatedAt = a.CreatedAt.UTC()
	if a.FinishedAt != nil {
		t := a.FinishedAt.UTC()
		a.FinishedAt = &t
	}
	return a, old, nil
}

// stopAtRail puts a stop order on the payout's reference at the rail
// (POST RAIL_URL/stops {"reference": P}), through the transport of the
// submissions, within RailTimeout, and returns the payments the rail
// answers it had already recorded with that reference. After the stop
// the rail refuses any submission with it, so the list is final: an empty
// one means the money did not move and never will, however late the
// original forward's call reaches the rail. It keeps the records whose
// reference is the payout. The answer is decoded loosely (unknown fields
// ignored). Any failure wraps ErrUnavailable (the stop order is
// idempotent: the next reconciliation repeats it).
func (p *Proxy) stopAtRail(ctx context.Context, payout string) ([]rail.Submission, error) {
	body, err := json.Marshal(rail.StopRequest{Reference: payout})
	if err != nil {
		return nil, fmt.Errorf("%w: encode stop order: %v", ErrUnavailable, err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, p.stopURL, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%w: build rail stop order: %v", ErrUnavailable, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := p.rail.Do(hreq)
	if err != nil {
		return nil, fmt.Errorf("%w: rail stop order: %v", ErrUnavailable, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxRailLookupBytes))
	if err != nil {
		return nil, fmt.Errorf("%w: rail stop order answered %d, reading its body: %v", ErrUnavailable, resp.StatusCode, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%w: rail stop order answered %d", ErrUnavailable, resp.StatusCode)
	}
	var ans rail.StopAnswer // a missing or null "submissions" leaves it nil; [] does not
	if err := json.Unmarshal(raw, &ans); err != nil || ans.Submissions == nil {
		return nil, fmt.Errorf("%w: rail stop order answered 200 with an unreadable body", ErrUnavailable)
	}
	var out []rail.Submission
	for _, r := range ans.Submissions {
		if r.Request.Reference == payout {
			out = append(out, r)
		}
	}
	return out, nil
}

// maxRailLookupBytes bounds how much of the rail's record is read.
const maxRailLookupBytes = 1 << 20

// sqlUnsettled lists the payouts' forwarded attempts still forwarding or
// ambiguous and older than the abandon threshold ($1, ms), after attempt
// $2, at most $3.
const sqlUnsettled = `
SELECT a.attempt_id, a.payout_id, a.account_id, a.amount_minor, a.currency, a.token, a.owner_id, a.state,
       COALESCE(a.rail_ref, ''), a.created_at, a.finished_at
  FROM rail_payout p JOIN rail_attempt a USING (attempt_id)
 WHERE a.state IN ('forwarding', 'ambiguous')
   AND a.created_at < now() - $1::bigint * interval '1 millisecond'
   AND a.attempt_id > $2
 ORDER BY a.attempt_id
 LIMIT $3`

// handleUnsettled serves GET PathUnsettled: the holder's token and proof
// of a grant on api.UnsettledLockKey are verified (while fencing is on),
// as a reconciliation's are on the payout's lock, then one page of
// unsettled forwarded attempts is answered.
func (p *Proxy) handleUnsettled(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		p.methodNotAllowed(w, r, http.MethodGet)
		return
	}
	h, ok := p.holder(w, r)
	if !ok {
		return
	}
	q, err := jsonhandler.Query(r, api.QueryLimit, api.QueryAfter)
	if err != nil {
		p.fail(r.Context(), w, p.log, fmt.Errorf("%w: %v", ErrInvalidRequest, err))
		return
	}
	limit, after := int64(api.DefaultUnsettledLimit), int64(0)
	for name, dst := range map[string]*int64{api.QueryLimit: &limit, api.QueryAfter: &after} {
		vals, ok := q[name]
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(vals[0], 10, 64)
		if len(vals) != 1 || err != nil || n < 1 || name == api.QueryLimit && n > api.MaxUnsettledLimit {
			p.fail(r.Context(), w, p.log, fmt.Errorf("%w: query parameter %s must be given once, a positive integer (limit at most %d)",
				ErrInvalidRequest, name, api.MaxUnsettledLimit))
			return
		}
		*dst = n
	}
	for name := range q {
		if name != api.QueryLimit && name != api.QueryAfter {
			p.fail(r.Context(), w, p.log, fmt.Errorf("%w: unknown query parameter %q", ErrInvalidRequest, name))
			return
		}
	}
	if !p.cfg.FencingDisabled {
		if err := fencing.Verify(p.cfg.ProofKeys, h.Proof, api.UnsettledLockKey, h.Token); err != nil {
			fencing.LogUnverified(r.Context(), p.log, "rail", api.UnsettledLockKey, h.Token, h.Owner, err)
			p.fail(r.Context(), w, p.log, fmt.Errorf("%w: %w", ErrUnverifiedToken, err))
			return
		}
	}
	release, shed := p.begin(w, r)
	if shed != nil {
		return
	}
	defer release()
	list, err := p.unsettled(r.Context(), after, limit)
	if err != nil {
		p.fail(r.Context(), w, p.log, fmt.Errorf("%w: %w", errReconciling, err))
		return
	}
	jsonhandler.WriteJSON(w, http.StatusOK, list)
}

// unsettled reads one page of sqlUnsettled.
func (p *Proxy) unsettled(ctx context.Context, after, limit int64) (_ api.UnsettledList, err error) {
	ctx, done := p.dbCall(ctx)
	defer func() { done(err) }()
	rows, err := p.pool.Query(ctx, sqlUnsettled, p.abandonAfter().Milliseconds(), after, limit)
	if err != nil {
		return api.UnsettledList{}, dbError("list unsettled attempts", err)
	}
	out := api.UnsettledList{Attempts: []api.Attempt{}}
	for rows.Next() {
		var a api.Attempt
		if err := rows.Scan(&a.AttemptID, &a.PayoutID, &a.AccountID, &a.AmountMinor, &a.Currency, &a.Token,
			&a.OwnerID, &a.State, &a.RailRef, &a.CreatedAt, &a.FinishedAt); err != nil {
			rows.Close()
			return api.UnsettledList{}, dbError("list unsettled attempts", err)
		}
		a.CreatedAt = a.CreatedAt.UTC()
		if a.FinishedAt != nil {
			t := a.FinishedAt.UTC()
			a.FinishedAt = &t
		}
		out.Attempts = append(out.Attempts, a)
	}
	if err := rows.Err(); err != nil {
		return api.UnsettledList{}, dbError("list unsettled attempts", err)
	}
	if int64(len(out.Attempts)) == limit {
		out.Next = out.Attempts[len(out.Attempts)-1].AttemptID
	}
	return out, nil
}
