package explore

// The adversarial holder, the resend, the permanent refusal, and the
// coverage evidence: what rail-proxy answered in a schedule.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
)

// Paths: the rail-proxy outcomes a schedule may reach, as Result.Paths
// names them. Each is judged from rail-proxy's answers (seen in front of
// it) or from raildb after the schedule.
const (
	// PathForwarded: a submission went to the rail and was answered 200.
	PathForwarded = "forwarded"
	// PathFencedOut: a submission was refused 409 FENCED_OUT.
	PathFencedOut = "fenced-out"
	// PathAlreadySubmitted: a submission was refused 409
	// PAYOUT_ALREADY_SUBMITTED with the payout's forward.
	PathAlreadySubmitted = "already-submitted"
	// PathAmbiguous: a submission was answered 502 RAIL_AMBIGUOUS.
	PathAmbiguous = "rail-ambiguous"
	// PathNotSentReleased: the rail refused a call and recorded nothing;
	// rail-proxy recorded the attempt not_sent and released the payout's
	// forward (an attempt of raildb in state not_sent).
	PathNotSentReleased = "not-sent-released"
	// PathNotSentKept: the rail refused a call and recorded nothing, but
	// the attempt had meanwhile been marked ambiguous (abandoned) or
	// reconciled: it stayed the payout's forward (a RAIL_NOT_REACHED
	// answer without its not_sent attempt).
	PathNotSentKept = "not-sent-kept"
	// PathResendAfterNotSent: after a not_sent release, a later attempt of
	// the same payout with the same token (the holder's own resend) was
	// let through to the rail.
	PathResendAfterNotSent = "own-resend-after-not-sent"
	// PathStaleResendFenced: a resend (FaultResend) was refused
	// FENCED_OUT: a newer holder had raised the high-water mark.
	PathStaleResendFenced = "stale-resend-fenced"
	// PathInvalidTerms: a submission was refused 403 INVALID_TERMS.
	PathInvalidTerms = "invalid-terms"
	// PathClosed: a reconciliation closed a payout rail-proxy had never
	// forwarded (no forward before it, answered 200).
	PathClosed = "closed-never-forwarded"
	// PathLateAfterClose: a submission of a payout arrived after a
	// reconciliation had closed it (and was refused).
	PathLateAfterClose = "late-submission-after-close"
	// PathStopped: a submission reached the rail after a reconciliation's
	// stop order and was answered 409 PAYOUT_STOPPED.
	PathStopped = "payout-stopped"
	// PathReconciled: a reconciliation resolved a forwarded attempt that
	// was forwarding or ambiguous (answered 200, resolved).
	PathReconciled = "reconciled-in-doubt"
)

// headerResend marks a resend (FaultResend), headerForged a forged
// submission, for the explorer's own handler in front of rail-proxy.
const (
	headerResend = "X-Explore-Resend"
	headerForged = "X-Explore-Forged"
)

// answer is one answer of rail-proxy to a submission or a
// reconciliation of a payout of the run, in the order they ended.
type answer struct {
	reconciliation bool
	payout         string
	resend, forged bool
	status         int
	code           railapi.Code
	// attempt is the payout's forward the answer carries (a
	// PAYOUT_ALREADY_SUBMITTED refusal, a reconciliation), nil otherwise.
	attempt *railapi.Attempt
	// resolved: a reconciliation that recorded the outcome; closed: a
	// reconciliation of a payout that had no forward before it.
	resolved, closed bool
}

// seen collects a run's answers and the forgeries' verdicts.
type seen struct {
	mu      sync.Mutex
	answers []answer
	// forgery lists, per forged submission, what was wrong with its
	// handling ("" when it was refused 403 with nothing recorded).
	forgery []string
}

// capture records the status and body of an answer on its way out.
type capture struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (c *capture) WriteHeader(status int) {
	if c.status == 0 {
		c.status = status
	}
	c.ResponseWriter.WriteHeader(status)
}

func (c *capture) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	c.body.Write(b)
	return c.ResponseWriter.Write(b)
}

// decode reads c's answer: its code (an error envelope's) and the
// attempt it carries, if any.
func (c *capture) decode(reconciliation bool) (railapi.Code, *railapi.Attempt, bool) {
	if reconciliation && c.status == http.StatusOK {
		var rec railapi.Reconciliation
		if json.Unmarshal(c.body.Bytes(), &rec) != nil {
			return "", nil, false
		}
		return "", &rec.Attempt, rec.Resolved
	}
	var ans railapi.AlreadySubmittedAnswer
	if json.Unmarshal(c.body.Bytes(), &ans) != nil {
		return "", nil, false
	}
	if ans.Error.Code == railapi.CodeAlreadySubmitted {
		return ans.Error.Code, &ans.Attempt, false
	}
	return ans.Error.Code, nil, false
}

// submission records rail-proxy's answer c to the submission r.
func (s *seen) submission(r *http.Request, payout string, c *capture) {
	code, attempt, _ := c.decode(false)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answers = append(s.answers, answer{payout: payout, resend: r.Header.Get(headerResend) != "", forged: r.Header.Get(headerForged) != "",
		status: c.status, code: code, attempt: attempt})
}

// watchReconciliation serves a reconciliation of payout and records its
// answer, noting whether the payout had a forward before it.
func (r *run) watchReconciliation(next http.Handler, w http.ResponseWriter, req *http.Request, payout string) {
	var forwarded bool
	if err := r.e.p.RailDB.QueryRow(req.Context(), `SELECT EXISTS (SELECT 1 FROM rail_payout WHERE payout_id = $1)`, payout).Scan(&forwarded); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	c := &capture{ResponseWriter: w}
	next.ServeHTTP(c, req)
	_, attempt, resolved := c.decode(true)
	r.seen.mu.Lock()
	defer r.seen.mu.Unlock()
	r.seen.answers = append(r.seen.answers, answer{reconciliation: true, payout: payout, status: c.status, attempt: attempt,
		resolved: resolved, closed: c.status == http.StatusOK && !forwarded})
}

// sentRequest is a submission as it was sent, to be sent again.
type sentRequest struct {
	url    string
	header http.Header
	body   []byte
}

// keep copies req (and puts its body back).
func keep(req *http.Request) (*sentRequest, error) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	return &sentRequest{url: req.URL.String(), header: req.Header.Clone(), body: body}, nil
}

// sent reports whether the holder has sent a submission.
func (d *doer) sent() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.last != nil
}

// rejected is the answer to a submission refused for good (FaultReject):
// rail-proxy's 400 INVALID_REQUEST, not retryable; nothing recorded.
func rejected() *http.Response {
	w := httptest.NewRecorder()
	jsonhandler.WriteJSON(w, http.StatusBadRequest, railapi.ErrorEnvelope{Error: railapi.ErrorBody{Code: railapi.CodeInvalidRequest,
		Message: "explore: refused for good (FaultReject); nothing recorded"}})
	return w.Result()
}

// forger is the adversary's own key: a well-formed Ed25519 key that
// payment-resource never held.
var forger = func() fenceproof.SigningKey {
	k, err := fenceproof.GenerateSigningKey("explore-forger", rand.NewChaCha8([32]byte{'f', 'o', 'r', 'g', 'e'}))
	if err != nil {
		panic(err)
	}
	return k
}()

// decoy is a payout of another account, created once per Explorer, whose
// genuine signature a forgery borrows.
type decoy struct {
	terms     fencewire.PayoutTerms
	signature string
}

// newDecoy creates the decoy payout through payment-resource and reads
// its signature.
func (e *Explorer) newDecoy(ctx context.Context) (decoy, error) {
	ev := payoutevent.Event{PayoutID: "decoy-1", AccountID: "acct-decoy", AmountMinor: 777_00, Currency: "EUR"}
	if err := e.p.CreatePayout(ctx, ev); err != nil {
		return decoy{}, err
	}
	p, err := e.p.Pay.Payout(ctx, ev.PayoutID)
	if err != nil {
		return decoy{}, err
	}
	return decoy{terms: fencewire.PayoutTerms(ev), signature: p.TermsSignature}, nil
}

// forgery is one way to alter a submission's terms.
type forgery struct {
	name  string
	alter func(body map[string]any, genuine railapi.SubmitRequest, d decoy)
}

// forgeries: what a holder with a real lease might send instead of its
// payout's terms. Each keeps the holder's token, proof and owner.
var forgeries = []forgery{
	{"another amount under the payout's own signature", func(b map[string]any, g railapi.SubmitRequest, _ decoy) {
		b["amountMinor"] = g.AmountMinor + 1
	}},
	{"another account under the payout's own signature", func(b map[string]any, g railapi.SubmitRequest, _ decoy) {
		b["accountId"] = g.AccountID + "-x"
	}},
	{"another payout's signature with that payout's amount", func(b map[string]any, _ railapi.SubmitRequest, d decoy) {
		b["amountMinor"], b["termsSignature"] = d.terms.AmountMinor, d.signature
	}},
	{"a signature over the payout with another amount, by a key not payment-resource's", func(b map[string]any, g railapi.SubmitRequest, _ decoy) {
		t := g.Terms()
		t.AmountMinor *= 10
		b["amountMinor"], b["termsSignature"] = t.AmountMinor, forger.Sign(fencewire.PayoutTermsDomain, t.Fields()...)
	}},
}

// forge sends each forgery of req (a holder's submission, not sent yet)
// to rail-proxy with the holder's headers, and records a verdict per
// forgery: refused 403, with raildb unchanged (no attempt, no high-water
// mark) for the payout, its account and the forged account.
func (r *run) forge(req *http.Request) error {
	ctx := req.Context()
	genuine, err := keep(req)
	if err != nil {
		return err
	}
	var g railapi.SubmitRequest
	if err := json.Unmarshal(genuine.body, &g); err != nil {
		return fmt.Errorf("explore: forge: read the submission: %w", err)
	}
	r.forging.Store(true)
	defer r.forging.Store(false)
	accounts := []string{g.AccountID, g.AccountID + "-x", r.e.decoy.terms.AccountID}
	for _, f := range forgeries {
		var body map[string]any
		if err := json.Unmarshal(genuine.body, &body); err != nil {
			return err
		}
		f.alter(body, g, r.e.decoy)
		// A forged signature travels where the executor sends the real
		// one: in its header (a body member that differs from the
		// header is refused 400 before the terms are checked).
		sig, forgedSig := body["termsSignature"].(string)
		delete(body, "termsSignature")
		raw, err := json.Marshal(body)
		if err != nil {
			return err
		}
		before, err := r.railRecords(ctx, g.PayoutID, accounts)
		if err != nil {
			return err
		}
		freq, err := http.NewRequestWithContext(ctx, http.MethodPost, genuine.url, bytes.NewReader(raw))
		if err != nil {
			return err
		}
		freq.Header = genuine.header.Clone()
		freq.Header.Set(headerForged, "1")
		if forgedSig {
			freq.Header.Set(railapi.HeaderTermsSignature, sig)
		}
		resp, err := http.DefaultClient.Do(freq)
		if err != nil {
			return fmt.Errorf("explore: forge: %w", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		after, err := r.railRecords(ctx, g.PayoutID, accounts)
		if err != nil {
			return err
		}
		verdict := ""
		switch {
		case resp.StatusCode != http.StatusForbidden:
			verdict = fmt.Sprintf("forged submission (%s) answered %d, not 403", f.name, resp.StatusCode)
		case before != after:
			verdict = fmt.Sprintf("forged submission (%s) refused, yet raildb changed: %s, then %s", f.name, before, after)
		}
		r.seen.mu.Lock()
		r.seen.forgery = append(r.seen.forgery, verdict)
		r.seen.mu.Unlock()
	}
	return nil
}

// railRecords summarises what raildb holds for payout and accounts: the
// number of attempts, the payout's forward and the high-water marks.
func (r *run) railRecords(ctx context.Context, payout string, accounts []string) (string, error) {
	var attempts int64
	var forward, marks string
	err := r.e.p.RailDB.QueryRow(ctx, `SELECT
 (SELECT count(*) FROM rail_attempt WHERE payout_id = $1 OR account_id = ANY($2)),
 (SELECT COALESCE(string_agg(attempt_id::text, ','), '') FROM rail_payout WHERE payout_id = $1),
 (SELECT COALESCE(string_agg(account_id || '=' || high_water, ',' ORDER BY account_id), '') FROM rail_high_water WHERE account_id = ANY($2))`,
		payout, accounts).Scan(&attempts, &forward, &marks)
	return fmt.Sprintf("%d attempts, forward [%s], high-water [%s]", attempts, forward, marks), err
}

// resend sends a copy of holder h's last submission to rail-proxy, on
// runCtx, and waits until rail-proxy has either answered it or called
// the rail with it; that call is returned, held, as rail-proxy's pending
// step (nil when there is none).
func (r *run) resend(ctx, runCtx context.Context, h int) (*arrival, error) {
	d := r.doers[h]
	d.mu.Lock()
	last := d.last
	d.mu.Unlock()
	req, err := http.NewRequestWithContext(runCtx, http.MethodPost, last.url, bytes.NewReader(last.body))
	if err != nil {
		return nil, err
	}
	req.Header = last.header.Clone()
	req.Header.Set(headerResend, "1")
	r.running.Store(railProxyIndex)
	defer r.running.Store(-1)
	r.detachedResend.Store(true)
	r.detached.Store(int32(h))
	r.bg.Go(func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
	select {
	case a := <-r.arrive:
		if a.holder != railProxyIndex || a.step != StepRail {
			return nil, fmt.Errorf("explore: %s arrived at %s during %s's resend", holderName(a.holder), a.step, holderName(h))
		}
		return &a, nil
	case <-r.proxyDone:
		r.detachedResend.Store(false)
		return nil, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// checkAdversary adds the checks of forged terms and recorded outcomes
// (CheckTerms, CheckRecorded) and fills res.Paths.
func (r *run) checkAdversary(ctx context.Context, res *Result, fail func(check, format string, args ...any)) error {
	r.seen.mu.Lock()
	answers := slices.Clone(r.seen.answers)
	forgery := slices.Clone(r.seen.forgery)
	r.seen.mu.Unlock()
	for _, v := range forgery {
		if v != "" {
			fail(CheckTerms, "%s", v)
		}
	}
	ids := make([]string, len(r.events))
	terms := map[string]fencewire.PayoutTerms{}
	for i, ev := range r.events {
		ids[i] = ev.PayoutID
		terms[ev.PayoutID] = fencewire.PayoutTerms(ev)
		for _, s := range r.e.p.Stub.Submissions(ev.PayoutID) {
			got := fencewire.PayoutTerms{PayoutID: s.Request.PayoutID, AccountID: s.Request.AccountID, AmountMinor: s.Request.AmountMinor, Currency: s.Request.Currency}
			if got != terms[ev.PayoutID] {
				fail(CheckTerms, "the rail's journal holds %+v; paydb's terms are %+v", got, terms[ev.PayoutID])
			}
		}
	}
	type attempt struct {
		id, token int64
		payout    string
		state     railapi.State
		forward   bool
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

	// Coverage.
	paths := map[string]bool{}
	closed := map[string]bool{}
	notReached := 0
	for _, an := range answers {
		if an.reconciliation {
			switch {
			case an.closed:
				paths[PathClosed], closed[an.payout] = true, true
			case an.resolved:
				paths[PathReconciled] = true
			}
			continue
		}
		if closed[an.payout] && !an.forged {
			// The close made the closing attempt the payout's forward:
			// rail-proxy itself refuses what comes later, before the rail
			// (the stop order there is the second line, not the first).
			paths[PathLateAfterClose] = true
			if an.status == http.StatusOK || an.code == railapi.CodePayoutStopped || an.code == railapi.CodeRailAmbiguous || an.code == railapi.CodeRailNotReached {
				fail(CheckRecorded, "a submission of %s went to the rail (answered %d %s) after a reconciliation closed it", an.payout, an.status, an.code)
			}
		}
		switch {
		case an.status == http.StatusOK:
			paths[PathForwarded] = true
		case an.code == railapi.CodeFencedOut:
			paths[PathFencedOut] = true
			if an.resend {
				paths[PathStaleResendFenced] = true
			}
		case an.code == railapi.CodeAlreadySubmitted:
			paths[PathAlreadySubmitted] = true
		case an.code == railapi.CodeRailAmbiguous:
			paths[PathAmbiguous] = true
		case an.code == railapi.CodeRailNotReached:
			notReached++
		case an.code == railapi.CodeInvalidTerms:
			paths[PathInvalidTerms] = true
		case an.code == railapi.CodePayoutStopped:
			paths[PathStopped] = true
		}
	}
	notSent := map[string][]int64{} // payout -> tokens of its not_sent attempts
	released := 0
	for _, a := range attempts {
		switch a.state {
		case railapi.StateNotSent:
			released++
			notSent[a.payout] = append(notSent[a.payout], a.token)
		case railapi.StateFenced, railapi.StateDuplicate:
		default:
			if slices.Contains(notSent[a.payout], a.token) {
				paths[PathResendAfterNotSent] = true
			}
		}
	}
	if released > 0 {
		paths[PathNotSentReleased] = true
	}
	if notReached > released {
		paths[PathNotSentKept] = true
	}
	for p := range paths {
		res.Paths = append(res.Paths, p)
	}
	slices.Sort(res.Paths)
	return nil
}
