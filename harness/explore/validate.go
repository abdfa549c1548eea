package explore

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	payapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
)

// Names of the checks, as Result.Checks lists them.
const (
	// CheckAudit: payoutaudit found a violation (INV-04, INV-05).
	CheckAudit = "audit"
	// CheckRailOnce: the rail received the payout more than once (INV-04);
	// also reported under CheckAudit.
	CheckRailOnce = "rail-once"
	// CheckTokens: grant tokens did not strictly increase (INV-02).
	CheckTokens = "grant-tokens"
	// CheckFences: a fence point accepted a lower token (INV-03).
	CheckFences = "fences"
	// CheckEndedLease: a submission reached the rail although the server
	// had ended its holder's lease before the holder's last check.
	CheckEndedLease = "ended-lease"
	// CheckSettled: after the last delivery and the reconciler, a payout
	// is not posted, declined or failed: it would wait for a person
	// although the rail's record could settle it.
	CheckSettled = "settled"
	// CheckTerms: a forged submission (FaultForge) was not refused 403,
	// or changed raildb (an attempt or a high-water mark recorded), or
	// terms other than paydb's reached the rail's journal or raildb's
	// attempts.
	CheckTerms = "terms"
	// CheckRecorded: an attempt rail-proxy answered as the payout's
	// forward with an outcome (ambiguous, acked, declined, not_at_rail)
	// was later released or went back (a not_sent release that raced an
	// abandonment or a reconciliation), or a submission of a payout the
	// reconciler had closed went on to the rail.
	CheckRecorded = "recorded-outcome"
)

// endedLease is a fault: the lease carrying token ended on the server at
// schedule position index.
type endedLease struct {
	index int
	token int64
}

// finish lets Pub/Sub redeliver each payout's event to one more,
// unscheduled, executor until an answer would be acknowledged; then time
// passes beyond rail-proxy's abandon threshold and an unscheduled
// reconciler settles what is left in doubt, as its next scheduled pass
// would.
func (r *run) finish(ctx context.Context) error {
	if s, err := r.e.p.Locks.Inspect(ctx, r.events[0].LockKey()); err != nil {
		return err
	} else if s.Lease != nil {
		r.e.p.LockClock.Advance(ttl + time.Millisecond)
	}
	x, err := r.executor("Z", &doer{r: r, holder: -1})
	if err != nil {
		return err
	}
	for _, ev := range r.events {
		var (
			err2 error
			done bool
		)
		for range 3 {
			out, err := x.Execute(ctx, ev)
			if executor.Status(out, err) == http.StatusOK {
				done = true
				break
			}
			err2 = err
		}
		if !done {
			return fmt.Errorf("explore: the last delivery of %s never ended: %w", ev.PayoutID, err2)
		}
	}
	// Its last release, before the reconciler asks for the lock.
	if err := x.Close(ctx); err != nil {
		return err
	}
	if err := r.age(ctx); err != nil {
		return err
	}
	y, err := r.reconciler("Y", &doer{r: r, holder: -1})
	if err != nil {
		return err
	}
	_, err = r.settleAll(ctx, y)
	return err
}

// fail reports one broken check.
type failFunc func(check, format string, args ...any)

// check fills res.Violations and res.Checks from the records, stage by
// stage: the audit of the rail's journal and the books, the grants'
// tokens, each fence point, the ended leases, then the adversary's checks;
// and res.Paths.
func (r *run) check(ctx context.Context, res *Result, steps []stepRecord, ended []endedLease) error {
	res.Violations = []string{}
	broken := map[string]bool{}
	fail := func(check, format string, args ...any) {
		broken[check] = true
		res.Violations = append(res.Violations, check+": "+fmt.Sprintf(format, args...))
	}
	if err := r.checkAudit(ctx, fail, broken); err != nil {
		return err
	}
	r.mu.Lock()
	grants := slices.Clone(r.grants)
	tokens := r.tokens
	r.mu.Unlock()
	checkTokens(grants, fail)
	forwarded, err := r.checkRailFence(ctx, fail)
	if err != nil {
		return err
	}
	if err := r.checkPayFence(ctx, res, fail); err != nil {
		return err
	}
	checkEndedLeases(ended, steps, tokens, forwarded, fail)
	if err := r.checkAdversary(ctx, res, fail); err != nil {
		return err
	}
	for c := range broken {
		res.Checks = append(res.Checks, c)
	}
	slices.Sort(res.Checks)
	return nil
}

// payoutIDs lists the run's payouts.
func (r *run) payoutIDs() []string {
	ids := make([]string, len(r.events))
	for i, ev := range r.events {
		ids[i] = ev.PayoutID
	}
	return ids
}

// checkAudit runs payoutaudit over the run's payouts (CheckAudit,
// CheckRailOnce).
func (r *run) checkAudit(ctx context.Context, fail failFunc, broken map[string]bool) error {
	ids := r.payoutIDs()
	rep, err := r.e.p.Audit(ctx, ids...)
	if err != nil {
		return err
	}
	for _, v := range rep.Violations {
		fail(CheckAudit, "%s", v)
		if v.Check == "rail_at_most_once_per_payout" {
			broken[CheckRailOnce] = true
		}
	}
	if len(rep.Unreconciled) > 0 {
		fail(CheckAudit, "payout left unreconciled: %v", rep.Unreconciled)
	}
	return nil
}

// checkTokens checks that grant tokens strictly increased (CheckTokens).
func checkTokens(grants []int64, fail failFunc) {
	for i := 1; i < len(grants); i++ {
		if grants[i] <= grants[i-1] {
			fail(CheckTokens, "grant %d has token %d after %d", i, grants[i], grants[i-1])
		}
	}
}

// checkRailFence checks rail-proxy's forwards (CheckFences) and returns
// the tokens it forwarded.
func (r *run) checkRailFence(ctx context.Context, fail failFunc) (map[int64]bool, error) {
	// Fence point two: forwarded tokens strictly increase per account.
	// The one equal token allowed: the holder's own resend of a payout
	// whose forward with that token was released not_sent.
	rows, err := r.e.p.RailDB.Query(ctx, `SELECT payout_id, token, state FROM rail_attempt WHERE account_id = $1 ORDER BY attempt_id`, r.events[0].AccountID)
	if err != nil {
		return nil, err
	}
	var (
		last                int64
		lastPayout, lastSet string
		forwarded           = map[int64]bool{}
	)
	for rows.Next() {
		var tok int64
		var payout, state string
		if err := rows.Scan(&payout, &tok, &state); err != nil {
			rows.Close()
			return nil, err
		}
		if s := railapi.State(state); s == railapi.StateFenced || s == railapi.StateDuplicate {
			continue
		}
		forwarded[tok] = true
		if tok < last || tok == last && (payout != lastPayout || railapi.State(lastSet) != railapi.StateNotSent) {
			fail(CheckFences, "rail-proxy forwarded token %d after %d", tok, last)
		}
		last, lastPayout, lastSet = tok, payout, state
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return forwarded, nil
}

// checkPayFence checks payment-resource's fenced writes and that each
// payout ended settled (CheckFences, CheckSettled).
func (r *run) checkPayFence(ctx context.Context, res *Result, fail failFunc) error {
	ids := r.payoutIDs()
	// Fence point one: each payout's fenced writes never go back, and no
	// write of any payout of the account carries a token below the
	// account's last debit (the account fence).
	for _, ev := range r.events {
		if err := r.checkPayout(ctx, res, ev.PayoutID, fail); err != nil {
			return err
		}
	}
	rows, err := r.e.p.PayDB.Query(ctx, `SELECT payout_id, to_state, token FROM payout_transition
WHERE payout_id = ANY($1) AND token IS NOT NULL ORDER BY transition_id`, ids)
	if err != nil {
		return err
	}
	var debit int64
	for rows.Next() {
		var (
			id, to string
			tok    int64
		)
		if err := rows.Scan(&id, &to, &tok); err != nil {
			rows.Close()
			return err
		}
		if tok < debit {
			fail(CheckFences, "payment-resource accepted a write of %s (to %s) with token %d after the account's debit with token %d", id, to, tok, debit)
		}
		if payapi.State(to) == payapi.StatePosted {
			debit = max(debit, tok)
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	return nil
}

// checkEndedLeases checks that no holder whose lease the server ended
// before its last check reached the rail (CheckEndedLease).
func checkEndedLeases(ended []endedLease, steps []stepRecord, tokens map[int]int64, forwarded map[int64]bool, fail failFunc) {
	// A lease the server ended before its holder's last check stops the
	// holder's submission.
	for _, end := range ended {
		for h, tok := range tokens {
			if tok != end.token || !forwarded[tok] {
				continue
			}
			check := -1
			for _, s := range steps {
				if s.holder != h {
					continue
				}
				if s.step == StepConfirm {
					check = s.index
				}
				if s.step == StepSubmit {
					if check < 0 {
						check = s.index // only a local check, made as it sent
					}
					break
				}
			}
			if check > end.index {
				fail(CheckEndedLease, "%s's lease (token %d) ended at step %d, before its last check at step %d, yet its submission reached the rail",
					holderName(h), tok, end.index, check)
			}
		}
	}
}

// checkPayout checks that the payout's fenced writes never went back to a
// lower token and that it ended settled (CheckFences, CheckSettled).
func (r *run) checkPayout(ctx context.Context, res *Result, id string, fail failFunc) error {
	rows, err := r.e.p.PayDB.Query(ctx, `SELECT token FROM payout_transition WHERE payout_id = $1 AND token IS NOT NULL ORDER BY transition_id`, id)
	if err != nil {
		return err
	}
	var last int64
	for rows.Next() {
		var tok int64
		if err := rows.Scan(&tok); err != nil {
			rows.Close()
			return err
		}
		if tok < last {
			fail(CheckFences, "payment-resource accepted a write of %s with token %d after %d", id, tok, last)
		}
		last = tok
	}
	if err := rows.Err(); err != nil {
		return err
	}
	p, err := r.e.p.Pay.Payout(ctx, id)
	if err != nil {
		return err
	}
	res.Ended = append(res.Ended, string(p.State))
	switch p.State {
	case payapi.StatePosted, payapi.StateDeclined, payapi.StateFailed:
	default:
		fail(CheckSettled, "%s left %s after the last delivery and the reconciler", id, p.State)
	}
	return nil
}

// checkAdversary adds the checks of forged terms and recorded outcomes
// (CheckTerms, CheckRecorded) and fills res.Paths (report.go).
func (r *run) checkAdversary(ctx context.Context, res *Result, fail failFunc) error {
	r.seen.mu.Lock()
	answers := slices.Clone(r.seen.answers)
	forgery := slices.Clone(r.seen.forgery)
	r.seen.mu.Unlock()
	for _, v := range forgery {
		if v != "" {
			fail(CheckTerms, "%s", v)
		}
	}
	ids := r.payoutIDs()
	terms := map[string]fencewire.PayoutTerms{}
	for _, ev := range r.events {
		terms[ev.PayoutID] = fencewire.PayoutTerms(ev)
		for _, s := range r.e.p.Stub.Submissions(ev.PayoutID) {
			got := fencewire.PayoutTerms{PayoutID: s.Request.PayoutID, AccountID: s.Request.AccountID, AmountMinor: s.Request.AmountMinor, Currency: s.Request.Currency}
			if got != terms[ev.PayoutID] {
				fail(CheckTerms, "the rail's journal holds %+v; paydb's terms are %+v", got, terms[ev.PayoutID])
			}
		}
	}
	var attempts []attempt
	rows, err := r.e.p.RailDB.Query(ctx, `SELECT a.attempt_id, a.payout_id, a.account_id, a.amount_minor, a.currency, a.token, a.state,
       EXISTS (SELECT 1 FROM rail_payout p WHERE p.attempt_id = a.attempt_id)
  FROM rail_attempt a WHERE a.payout_id = ANY($1) ORDER BY a.attempt_id`, ids)
	if err != nil {
		return err
	}
	for rows.Next() {
		var (
			a  attempt
			t  fencewire.PayoutTerms
			st string
		)
		err := rows.Scan(&a.id, &a.payout, &t.AccountID, &t.AmountMinor, &t.Currency, &a.token, &st, &a.forward)
		if err != nil {
			rows.Close()
			return err
		}
		t.PayoutID, a.state = a.payout, railapi.State(st)
		if t != terms[a.payout] {
			fail(CheckTerms, "raildb recorded attempt %d (%s) with terms %+v; paydb's are %+v", a.id, a.state, t, terms[a.payout])
		}
		attempts = append(attempts, a)
	}
	if err := rows.Err(); err != nil {
		return err
	}

	// An outcome rail-proxy answered stays: the attempt it named is still
	// the payout's forward, and ambiguous at most turns into a result.
	byID := map[int64]attempt{}
	for _, a := range attempts {
		byID[a.id] = a
	}
	for _, an := range answers {
		if an.attempt == nil || an.attempt.AttemptID == 0 {
			continue
		}
		told := an.attempt.State
		if told != railapi.StateAmbiguous && told != railapi.StateAcked && told != railapi.StateDeclined && told != railapi.StateNotAtRail {
			continue
		}
		now, ok := byID[an.attempt.AttemptID]
		switch {
		case !ok:
			fail(CheckRecorded, "attempt %d of %s, answered %s, is gone", an.attempt.AttemptID, an.payout, told)
		case !now.forward:
			fail(CheckRecorded, "attempt %d of %s, answered %s as the payout's forward, is no longer its forward (now %s)", now.id, an.payout, told, now.state)
		case told == railapi.StateAmbiguous && now.state != railapi.StateAmbiguous && now.state != railapi.StateAcked &&
			now.state != railapi.StateDeclined && now.state != railapi.StateNotAtRail,
			told != railapi.StateAmbiguous && now.state != told:
			fail(CheckRecorded, "attempt %d of %s, answered %s, ended %s", now.id, an.payout, told, now.state)
		}
	}

	// Once a reconciliation closed a payout (the closing attempt its
	// forward), rail-proxy refuses what comes later before the rail.
	closed := map[string]bool{}
	for _, an := range answers {
		switch {
		case an.reconciliation:
			closed[an.payout] = closed[an.payout] || an.closed
		case closed[an.payout] && !an.forged &&
			(an.status == http.StatusOK || an.code == railapi.CodePayoutStopped || an.code == railapi.CodeRailAmbiguous || an.code == railapi.CodeRailNotReached):
			fail(CheckRecorded, "a submission of %s went to the rail (answered %d %s) after a reconciliation closed it", an.payout, an.status, an.code)
		}
	}
	res.Paths = paths(answers, attempts)
	return nil
}

// attempt is a rail attempt of the run as raildb holds it at the end.
type attempt struct {
	id, token int64
	payout    string
	state     railapi.State
	forward   bool
}
