package executor_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor/fault"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/logtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	lockapi "github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// fakeDeps stands in for payment-resource and rail-proxy: it records every
// call with its token and answers as the test scripts it.
type fakeDeps struct {
	mu    sync.Mutex
	calls []string
	// payout is p-1's terms (zero: the event's); a claim that names
	// others is refused PAYOUT_TERMS_MISMATCH, as payment-resource does.
	// claims are the bodies of the claims, claimed counts those accepted.
	payout     api.ClaimRequest
	claims     []api.ClaimRequest
	claimed    int
	claimCode  api.Code // "" = 200
	railStatus int      // -1: close the connection without an answer
	railBody   string
	resultCode api.Code
	results    []map[string]any
	// resultFailures answers the first N results 503 with
	// resultFailCode (DATABASE_UNAVAILABLE when empty) and, when
	// resultRetryAfter is set, that Retry-After.
	resultFailures   int
	resultFailCode   api.Code
	resultRetryAfter string
	resultTimes      []time.Time
	attnCode         api.Code // "" = 200
	attentions       []map[string]any
	// terms is the termsSignature of the claim's answer; submissions are
	// the bodies sent to rail-proxy, termsHeaders the values of their
	// api.HeaderTermsSignature.
	terms        string
	submissions  []map[string]any
	termsHeaders [][]string
}

func (f *fakeDeps) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	tok := r.Header.Get(fencewire.HeaderToken)
	f.calls = append(f.calls, r.Method+" "+r.URL.Path+" token="+tok)
	switch {
	case r.URL.Path == api.ClaimPath("p-1"):
		var terms api.ClaimRequest
		_ = json.NewDecoder(r.Body).Decode(&terms)
		f.claims = append(f.claims, terms)
		payout := cmp.Or(f.payout, api.ClaimRequest{AccountID: event.AccountID, AmountMinor: event.AmountMinor, Currency: event.Currency})
		if terms != (api.ClaimRequest{}) && terms != payout {
			jsonhandler.WriteError(w, statusOf(api.CodePayoutTermsMismatch), string(api.CodePayoutTermsMismatch), "scripted", false)
			return
		}
		if f.claimCode != "" {
			jsonhandler.WriteError(w, statusOf(f.claimCode), string(f.claimCode), "scripted", false)
			return
		}
		f.claimed++
		jsonhandler.WriteJSON(w, 200, map[string]string{"payoutId": "p-1", "state": "claimed", "termsSignature": f.terms})
	case r.URL.Path == railapi.PathSubmissions:
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		f.submissions = append(f.submissions, body)
		f.termsHeaders = append(f.termsHeaders, r.Header.Values(railapi.HeaderTermsSignature))
		if f.railStatus < 0 { // the answer is lost: the connection breaks
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				_ = conn.Close()
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(f.railStatus)
		_, _ = w.Write([]byte(f.railBody))
	case r.URL.Path == api.AttentionPath("p-1"):
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		body["token"] = tok
		f.attentions = append(f.attentions, body)
		if f.attnCode != "" {
			jsonhandler.WriteError(w, statusOf(f.attnCode), string(f.attnCode), "scripted", false)
			return
		}
		jsonhandler.WriteJSON(w, 200, map[string]string{"payoutId": "p-1", "state": "needs_attention"})
	case r.URL.Path == api.ResultPath("p-1"):
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		f.results = append(f.results, body)
		f.resultTimes = append(f.resultTimes, time.Now())
		if f.resultFailures > 0 {
			f.resultFailures--
			code := cmp.Or(f.resultFailCode, api.CodeUnavailable)
			if f.resultRetryAfter != "" {
				w.Header().Set("Retry-After", f.resultRetryAfter)
			}
			jsonhandler.WriteError(w, http.StatusServiceUnavailable, string(code), "scripted", true)
			return
		}
		if f.resultCode != "" {
			jsonhandler.WriteError(w, statusOf(f.resultCode), string(f.resultCode), "scripted", false)
			return
		}
		jsonhandler.WriteJSON(w, 200, map[string]string{"payoutId": "p-1"})
	default:
		http.NotFound(w, r)
	}
}

// statusOf is the status payment-resource sends code with.
func statusOf(code api.Code) int {
	switch code {
	case api.CodeInvalidRequest, api.CodeInvalidToken:
		return http.StatusBadRequest
	case api.CodePayoutNotFound:
		return http.StatusNotFound
	case api.CodeUnavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusConflict
}

func (f *fakeDeps) railCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if len(c) > 25 && c[:25] == "POST /v1/rail/submissions" {
			n++
		}
	}
	return n
}

var event = payoutevent.Event{PayoutID: "p-1", AccountID: "acct-7", AmountMinor: 2500, Currency: "EUR"}

func newExecutor(t *testing.T, deps *fakeDeps, f executor.Fault) (*executor.Executor, *memstore.Store) {
	t.Helper()
	store := memstore.New(nil)
	return loggedExecutor(t, store, nil, deps, io.Discard, f), store
}

// closeAtCleanup waits, when the test ends, for the lease releases x
// still has in flight (sent after the push's answer), so that none
// outlives the test or its lock-server.
func closeAtCleanup(t testing.TB, x *executor.Executor) {
	t.Cleanup(func() {
		if err := x.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
}

func push(t *testing.T, x http.Handler, body []byte) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	x.ServeHTTP(rec, httptest.NewRequest("POST", "/", bytes.NewReader(body)))
	return rec
}

func TestHappyPathPostsTheRailOutcomeWithTheLeaseToken(t *testing.T) {
	deps := &fakeDeps{railStatus: 200, railBody: `{"status":"ACK","railRef":"rail-000001"}`}
	x, store := newExecutor(t, deps, nil)
	body, _ := payoutevent.Encode(event, "m-1", "acct-7", 1)
	rec := push(t, x, body)
	if rec.Code != 200 {
		t.Fatalf("push answered %d %s; want 200 (ack)", rec.Code, rec.Body)
	}
	if err := x.Close(t.Context()); err != nil { // the release follows the answer
		t.Fatal(err)
	}
	st, _ := store.Inspect(context.Background(), "payout:acct-7")
	if st.Lease != nil || st.LastToken == 0 {
		t.Fatalf("lock after the payout: %+v; want granted once and released", st)
	}
	want := "token=" + strconv.FormatInt(st.LastToken, 10)
	for _, c := range deps.calls {
		if c[:4] == "POST" && !bytes.HasSuffix([]byte(c), []byte(want)) {
			t.Errorf("write %q does not carry the lease's token (%s)", c, want)
		}
	}
	if len(deps.results) != 1 || deps.results[0]["outcome"] != "ACK" || deps.results[0]["railRef"] != "rail-000001" {
		t.Fatalf("results posted: %v", deps.results)
	}
}

// rail-proxy forwards only terms payment-resource signed: the executor sends the signature of the payout it claimed, as
// payment-resource answered the claim, with exactly the payout's terms, in
// the header api.HeaderTermsSignature (a rail-proxy older than the check
// ignores a header, where it refuses an unknown body member).
func TestSubmissionCarriesTheClaimedPayoutsTermsSignature(t *testing.T) {
	deps := &fakeDeps{railStatus: 200, railBody: `{"status":"ACK","railRef":"rail-000001"}`, terms: "pay-1.signature-of-p-1"}
	x, _ := newExecutor(t, deps, nil)
	body, _ := payoutevent.Encode(event, "m-1", "acct-7", 1)
	if rec := push(t, x, body); rec.Code != 200 {
		t.Fatalf("push answered %d %s; want 200", rec.Code, rec.Body)
	}
	want := map[string]any{"payoutId": "p-1", "accountId": "acct-7", "amountMinor": 2500.0, "currency": "EUR"}
	if len(deps.submissions) != 1 || !maps.Equal(deps.submissions[0], want) {
		t.Fatalf("submissions %v; want one, %v", deps.submissions, want)
	}
	if h := deps.termsHeaders[0]; len(h) != 1 || h[0] != deps.terms {
		t.Fatalf("header %s = %q; want [%s]", railapi.HeaderTermsSignature, h, deps.terms)
	}
}

// The fault: one altered payout used to loop until the dead-letter topic,
// because every INVALID_TERMS was taken for a key mismatch. The refusals
// of the terms are classified once, from their codes: INVALID_TERMS (a
// known key's signature over other terms) marks the payout
// needs_attention (rail_request_refused) and acknowledges the delivery;
// TERMS_KEY_UNKNOWN and TERMS_UNSIGNED (the same for every payout: the
// deployment) are redelivered and mark nothing.
func TestTermsRefusalsAreClassifiedByTheirCodes(t *testing.T) {
	refusal := func(code railapi.Code) *fakeDeps {
		b, _ := json.Marshal(railapi.ErrorEnvelope{Error: railapi.ErrorBody{Code: code, Message: "scripted", Retryable: code.Retryable()}})
		return &fakeDeps{railStatus: http.StatusForbidden, railBody: string(b), terms: "test-pay.sig"}
	}
	for _, c := range []struct {
		code       railapi.Code
		wantOut    executor.Outcome
		wantErr    error
		wantStatus int
		wantMarks  int
	}{
		{railapi.CodeInvalidTerms, executor.OutcomeNeedsAttention, nil, http.StatusOK, 1},
		{railapi.CodeTermsKeyUnknown, "", executor.ErrDependency, http.StatusServiceUnavailable, 0},
		{railapi.CodeTermsUnsigned, "", executor.ErrDependency, http.StatusServiceUnavailable, 0},
	} {
		t.Run(string(c.code), func(t *testing.T) {
			deps := refusal(c.code)
			x, _ := newExecutor(t, deps, nil)
			out, err := x.Execute(t.Context(), event)
			if out != c.wantOut || !errors.Is(err, c.wantErr) || (c.wantErr == nil) != (err == nil) {
				t.Fatalf("Execute = %q, %v; want %q, %v", out, err, c.wantOut, c.wantErr)
			}
			if got := executor.Status(out, err); got != c.wantStatus {
				t.Errorf("push status %d, want %d", got, c.wantStatus)
			}
			if len(deps.attentions) != c.wantMarks {
				t.Fatalf("attention marks %v; want %d", deps.attentions, c.wantMarks)
			}
			if c.wantMarks == 1 && deps.attentions[0]["reason"] != string(api.ReasonRailRequestRefused) {
				t.Errorf("attention reason %v; want %s", deps.attentions[0]["reason"], api.ReasonRailRequestRefused)
			}
			if len(deps.results) != 0 {
				t.Errorf("results posted %v; want none: the rail was not called", deps.results)
			}
		})
	}
}

// staleBeforeSubmit returns hooks that make the worker a stale holder
// right before its rail submission: its lease is revoked and the account's
// lock granted to another worker (a newer token), as when the worker was
// paused past its TTL.
func staleBeforeSubmit(t *testing.T, store **memstore.Store) executor.Fault {
	return fault.Points{executor.BeforeSubmit: func(context.Context, executor.Delivery, *client.Lease) {
		if _, err := (*store).Revoke(context.Background(), "payout:acct-7", 0); err != nil {
			t.Errorf("revoke: %v", err)
		}
		if _, err := (*store).Acquire(context.Background(), "payout:acct-7", "worker-b", time.Minute); err != nil {
			t.Errorf("acquire by the newer holder: %v", err)
		}
	}}
}

// loggedExecutor serves lock-server over store (through wrap, when not
// nil) and deps, and returns an executor of them whose log lines go to
// logs as JSON, with fault f.
func loggedExecutor(t *testing.T, store *memstore.Store, wrap func(http.Handler) http.Handler, deps *fakeDeps, logs io.Writer, f executor.Fault) *executor.Executor {
	t.Helper()
	ls, err := lockserver.NewServer(store, lockserver.DefaultServerConfig(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler = ls
	if wrap != nil {
		h = wrap(ls)
	}
	lsrv := httptest.NewServer(h)
	t.Cleanup(lsrv.Close)
	dsrv := httptest.NewServer(deps)
	t.Cleanup(dsrv.Close)
	cfg := executor.DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL = lsrv.URL, dsrv.URL, dsrv.URL
	cfg.Owner, cfg.LeaseTTL, cfg.AcquireWait = "worker-a", 2*time.Second, 3*time.Second
	cfg.ReportRetry = executor.RetryConfig{Attempts: 4, Initial: time.Millisecond, Max: 4 * time.Millisecond}
	x, err := executor.New(cfg, slog.New(slog.NewJSONHandler(logs, nil)), executor.WithRand(rand.New(rand.NewPCG(1, 2))), executor.WithFault(f))
	if err != nil {
		t.Fatal(err)
	}
	closeAtCleanup(t, x)
	return x
}

// A fence point refused the token, and lock-server did not answer the
// confirmation that judges the refusal: whether a newer holder exists is
// not known, so the worker neither logs itself fenced out by one nor
// marks anything; the delivery is redelivered as a dependency failure.
func TestFenceRefusalUnjudgedWhenLockServerDoesNotAnswer(t *testing.T) {
	deps := &fakeDeps{railStatus: 409, railBody: `{"error":{"code":"FENCED_OUT","message":"stale","retryable":false}}`}
	var down atomic.Bool
	unanswered := func(ls http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !down.Load() {
				ls.ServeHTTP(w, r)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":{"code":"` + lockapi.CodeBackendUnavailable + `","message":"down","retryable":true}}`))
		})
	}
	var logs logtest.Buffer
	x := loggedExecutor(t, memstore.New(nil), unanswered, deps, &logs,
		fault.Points{executor.BeforeSubmit: func(context.Context, executor.Delivery, *client.Lease) { down.Store(true) }})
	out, err := x.Execute(t.Context(), event)
	if !errors.Is(err, executor.ErrDependency) || executor.Status(out, err) != http.StatusServiceUnavailable {
		t.Fatalf("Execute = %q, %v; want ErrDependency and 503 so that Pub/Sub redelivers", out, err)
	}
	if len(deps.results) != 0 || len(deps.attentions) != 0 {
		t.Fatalf("an unjudged refusal posted results %v, attention marks %v", deps.results, deps.attentions)
	}
	if lines := logs.Events(t, executor.EventPayoutFencedStale); len(lines) != 0 {
		t.Fatalf("%s lines %v; want none: no newer holder is known", executor.EventPayoutFencedStale, lines)
	}
}

// A stale holder fenced out at rail-proxy is answered 409 (redelivered):
// the newer holder of the account's lock may be working on another payout
// of the account, so only a later delivery, with a newer lease, can be
// sure to finish this one. Nothing is marked.
func TestStaleHolderFencedOutIsRedelivered(t *testing.T) {
	deps := &fakeDeps{railStatus: 409, railBody: `{"error":{"code":"FENCED_OUT","message":"stale","retryable":false}}`}
	var store *memstore.Store
	x, s := newExecutor(t, deps, staleBeforeSubmit(t, &store))
	store = s
	out, err := x.Execute(t.Context(), event)
	if !errors.Is(err, executor.ErrFencedOut) || executor.Status(out, err) != http.StatusConflict {
		t.Fatalf("Execute = %q, %v; want ErrFencedOut and 409 so that Pub/Sub redelivers", out, err)
	}
	if len(deps.results) != 0 || len(deps.attentions) != 0 {
		t.Fatalf("a fenced worker posted results %v, attention marks %v", deps.results, deps.attentions)
	}
}

// The holder of the current lease fenced out at rail-proxy: the
// high-water mark holds a token lock-server never granted for the lock, so
// no later holder can pass either. The payout is marked needs_attention
// (rail_fence_ahead, with the lease's token) and the push acknowledged.
func TestCurrentHolderFencedOutMarksNeedsAttention(t *testing.T) {
	deps := &fakeDeps{railStatus: 409, railBody: `{"error":{"code":"FENCED_OUT","message":"stale","retryable":false}}`}
	x, store := newExecutor(t, deps, nil)
	body, _ := payoutevent.Encode(event, "m-1", "acct-7", 1)
	rec := push(t, x, body)
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"needs_attention"`) {
		t.Fatalf("push answered %d %s; want 200 needs_attention (acknowledged, not redelivered)", rec.Code, rec.Body)
	}
	st, _ := store.Inspect(context.Background(), "payout:acct-7")
	if len(deps.attentions) != 1 || deps.attentions[0]["reason"] != string(api.ReasonRailFenceAhead) ||
		deps.attentions[0]["token"] != strconv.FormatInt(st.LastToken, 10) {
		t.Fatalf("attention marks %v; want one %s with the lease's token %d", deps.attentions, api.ReasonRailFenceAhead, st.LastToken)
	}
	if len(deps.results) != 0 {
		t.Fatalf("results posted: %v", deps.results)
	}
}

// A transient answer to the result is retried in process, with backoff,
// and the payout is posted by the same delivery.
func TestTransientResultAnswersAreRetriedInProcess(t *testing.T) {
	deps := &fakeDeps{railStatus: 200, railBody: `{"status":"ACK","railRef":"rail-000001"}`, resultFailures: 3}
	x, _ := newExecutor(t, deps, nil)
	out, err := x.Execute(t.Context(), event)
	if err != nil || out != executor.OutcomePosted {
		t.Fatalf("Execute = %q, %v; want posted after three 503s", out, err)
	}
	if len(deps.results) != 4 {
		t.Fatalf("%d result posts; want 4 (three refused, one accepted)", len(deps.results))
	}
	// One more failure than the attempts: redelivered, with ErrDependency.
	deps = &fakeDeps{railStatus: 200, railBody: `{"status":"ACK","railRef":"rail-000001"}`, resultFailures: 4}
	x, _ = newExecutor(t, deps, nil)
	out, err = x.Execute(t.Context(), event)
	if !errors.Is(err, executor.ErrDependency) || executor.Status(out, err) != http.StatusServiceUnavailable || len(deps.results) != 4 {
		t.Fatalf("Execute = %q, %v after %d posts; want ErrDependency (503) after 4 posts", out, err, len(deps.results))
	}
}

// Payment-resource's 503s (OVERLOADED, and
// DATABASE_UNAVAILABLE while paydb is stalled) carry Retry-After; the
// in-process retry of a report waits it rather than its own backoff of a
// few milliseconds, which would only be refused again.
func TestReportRetryHonoursRetryAfter(t *testing.T) {
	for _, code := range []api.Code{api.CodeOverloaded, api.CodeUnavailable} {
		deps := &fakeDeps{railStatus: 200, railBody: `{"status":"ACK","railRef":"rail-000001"}`,
			resultFailures: 1, resultFailCode: code, resultRetryAfter: "1"}
		x, _ := newExecutor(t, deps, nil)
		out, err := x.Execute(t.Context(), event)
		if err != nil || out != executor.OutcomePosted {
			t.Fatalf("%s: Execute = %q, %v; want posted after one refusal", code, out, err)
		}
		if len(deps.resultTimes) != 2 {
			t.Fatalf("%s: %d result posts; want 2", code, len(deps.resultTimes))
		}
		// A lower bound only: the executor's own backoff here is 1..4 ms.
		if gap := deps.resultTimes[1].Sub(deps.resultTimes[0]); gap < time.Second {
			t.Errorf("%s: the retry came %v after the refusal; want at least its Retry-After, 1s", code, gap)
		}
	}
}

func TestRevokeAcknowledgedBeforeTheSubmissionStopsIt(t *testing.T) {
	deps := &fakeDeps{railStatus: 200, railBody: `{"status":"ACK","railRef":"r"}`}
	var store *memstore.Store
	// An operator revokes the lease right after the claim, and the revoke
	// is acknowledged; the worker's local deadline is far away and no
	// background renewal has run, yet it must not reach the rail: it
	// confirms the lease with lock-server before the submission.
	hooks := fault.Points{executor.AfterClaim: func(_ context.Context, _ executor.Delivery, lease *client.Lease) {
		if _, err := store.Revoke(context.Background(), "payout:acct-7", 0); err != nil {
			t.Errorf("revoke: %v", err)
		}
		if err := lease.Check(); err != nil {
			t.Errorf("the local check already failed (%v): the test would not show the confirmation", err)
		}
	}}
	x, s := newExecutor(t, deps, hooks)
	store = s
	out, err := x.Execute(t.Context(), event)
	if !errors.Is(err, executor.ErrNoLongerHolder) || executor.Status(out, err) != http.StatusServiceUnavailable {
		t.Fatalf("Execute = %q, %v; want ErrNoLongerHolder and 503", out, err)
	}
	if n := deps.railCalls(); n != 0 {
		t.Fatalf("%d rail submissions after the lease was lost; want 0", n)
	}
}

// Once the lease is granted, the event's lock key was accepted and the
// payout is claimed: a refusal of the confirmation before the rail
// submission that says nothing about the lease (a 400 INVALID_REQUEST,
// which at the acquire drops the event; a 4xx code this executor does not
// know, which elsewhere marks the payout) is redelivered as a dependency
// failure. Nothing is submitted, acknowledged or marked.
func TestLockServerRefusalOfTheConfirmationIsRedelivered(t *testing.T) {
	for _, c := range []struct {
		code   string
		status int
	}{
		{string(lockapi.CodeInvalidRequest), http.StatusBadRequest},
		{"NEWER_CODE", http.StatusUnprocessableEntity},
	} {
		t.Run(c.code, func(t *testing.T) {
			deps := &fakeDeps{railStatus: 200, railBody: `{"status":"ACK","railRef":"rail-000001"}`}
			var claimed atomic.Bool
			refuseRenewals := func(ls http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if claimed.Load() && lockOp(r) == "renew" {
						jsonhandler.WriteError(w, c.status, c.code, "scripted", false)
						return
					}
					ls.ServeHTTP(w, r)
				})
			}
			var logs logtest.Buffer
			x := loggedExecutor(t, memstore.New(nil), refuseRenewals, deps, &logs,
				fault.Points{executor.AfterClaim: func(context.Context, executor.Delivery, *client.Lease) { claimed.Store(true) }})
			body, _ := payoutevent.Encode(event, "m-1", "acct-7", 1)
			rec := push(t, x, body)
			var env jsonhandler.Envelope
			if err := json.Unmarshal(rec.Body.Bytes(), &env); rec.Code != http.StatusServiceUnavailable || err != nil || env.Error.Code != "DEPENDENCY_UNAVAILABLE" {
				t.Fatalf("push answered %d %s; want 503 DEPENDENCY_UNAVAILABLE (redelivered)", rec.Code, rec.Body)
			}
			out, err := x.Execute(t.Context(), event) // the same through Execute
			if !errors.Is(err, executor.ErrDependency) {
				t.Errorf("Execute = %q, %v; want ErrDependency", out, err)
			}
			if n := deps.railCalls(); n != 0 || len(deps.attentions) != 0 || len(deps.results) != 0 {
				t.Errorf("%d rail submissions, attention marks %v, results %v; want none", n, deps.attentions, deps.results)
			}
			for _, ev := range []string{executor.EventPayoutEventUnknownPayout, executor.EventPayoutRefusedPermanently, executor.EventPayoutAttentionUnrecorded} {
				if lines := logs.Events(t, ev); len(lines) != 0 {
					t.Errorf("%s lines %v; want none", ev, lines)
				}
			}
		})
	}
}

// alreadySubmitted is rail-proxy's refusal of a second submission of p-1,
// naming the attempt that went to the rail.
func alreadySubmitted(state, railRef string, token int64) string {
	att := map[string]any{"attemptId": 1, "payoutId": "p-1", "accountId": "acct-7", "amountMinor": 2500, "currency": "EUR",
		"token": token, "state": state, "railRef": railRef}
	b, _ := json.Marshal(map[string]any{
		"error":   map[string]any{"code": "PAYOUT_ALREADY_SUBMITTED", "message": "scripted", "retryable": state == "forwarding"},
		"attempt": att,
	})
	return string(b)
}

func TestPayoutAlreadySubmittedReportsThatSubmission(t *testing.T) {
	for _, c := range []struct {
		state   string
		want    executor.Outcome
		outcome string
	}{
		{"acked", executor.OutcomePosted, "ACK"},
		{"declined", executor.OutcomeDeclined, "DECLINE"},
		{"ambiguous", executor.OutcomeInDoubt, "AMBIGUOUS"},
	} {
		t.Run(c.state, func(t *testing.T) {
			ref := ""
			if c.state != "ambiguous" {
				ref = "rail-000009"
			}
			deps := &fakeDeps{railStatus: http.StatusConflict, railBody: alreadySubmitted(c.state, ref, 1)}
			x, _ := newExecutor(t, deps, nil)
			out, err := x.Execute(t.Context(), event)
			if err != nil || out != c.want {
				t.Fatalf("Execute = %q, %v; want %s", out, err, c.want)
			}
			// The result names the submission that reached the rail: its
			// reference and its token (1), not this worker's.
			if len(deps.results) != 1 || deps.results[0]["outcome"] != c.outcome || deps.results[0]["railToken"] != 1.0 {
				t.Fatalf("results: %v; want one %s with railToken 1", deps.results, c.outcome)
			}
			if ref != "" && deps.results[0]["railRef"] != ref {
				t.Fatalf("results: %v; want railRef %s", deps.results, ref)
			}
		})
	}
}

// A submission under the payout's id that is not the payout (another
// account or amount: forged, or a bug) went to the rail first. Its outcome
// says nothing about this payout: the payout is left in doubt, never
// posted on the strength of it.
func TestAlreadySubmittedUnderAnotherAccountIsInDoubt(t *testing.T) {
	var body map[string]any
	_ = json.Unmarshal([]byte(alreadySubmitted("acked", "rail-000009", 1)), &body)
	body["attempt"].(map[string]any)["accountId"] = "acct-8"
	b, _ := json.Marshal(body)
	deps := &fakeDeps{railStatus: http.StatusConflict, railBody: string(b)}
	x, _ := newExecutor(t, deps, nil)
	out, err := x.Execute(t.Context(), event)
	if err != nil || out != executor.OutcomeInDoubt {
		t.Fatalf("Execute = %q, %v; want in_doubt", out, err)
	}
	if len(deps.results) != 1 || deps.results[0]["outcome"] != "AMBIGUOUS" {
		t.Fatalf("results: %v; want one AMBIGUOUS", deps.results)
	}
}

func TestPayoutSubmissionStillInFlightIsRedelivered(t *testing.T) {
	deps := &fakeDeps{railStatus: http.StatusConflict, railBody: alreadySubmitted("forwarding", "", 1)}
	x, _ := newExecutor(t, deps, nil)
	out, err := x.Execute(t.Context(), event)
	if !errors.Is(err, executor.ErrSubmissionInFlight) || executor.Status(out, err) != http.StatusServiceUnavailable {
		t.Fatalf("Execute = %q, %v; want ErrSubmissionInFlight and 503 so that Pub/Sub asks again later", out, err)
	}
	if len(deps.results) != 0 {
		t.Fatalf("results: %v; want none while the first submission is unanswered", deps.results)
	}
}

func TestAmbiguousRailIsRecordedAndAcked(t *testing.T) {
	deps := &fakeDeps{railStatus: 502, railBody: `{"error":{"code":"RAIL_AMBIGUOUS","message":"timeout","retryable":false}}`}
	x, _ := newExecutor(t, deps, nil)
	out, err := x.Execute(t.Context(), event)
	if err != nil || out != executor.OutcomeInDoubt || executor.Status(out, err) != 200 {
		t.Fatalf("Execute = %q, %v; want in_doubt, acknowledged (never resubmitted blindly)", out, err)
	}
	if len(deps.results) != 1 || deps.results[0]["outcome"] != "AMBIGUOUS" {
		t.Fatalf("results: %v; want one AMBIGUOUS", deps.results)
	}
}

func TestFinishedPayoutIsAcked(t *testing.T) {
	deps := &fakeDeps{claimCode: api.CodePayoutFinished}
	x, _ := newExecutor(t, deps, nil)
	body, _ := payoutevent.Encode(event, "m-1", "acct-7", 2)
	if rec := push(t, x, body); rec.Code != 200 {
		t.Fatalf("duplicate delivery of a finished payout answered %d; want 200", rec.Code)
	}
	if n := deps.railCalls(); n != 0 {
		t.Fatalf("rail called %d times for a finished payout", n)
	}
}

// TestPaymentResourceAnswersAreClassifiedByTheirCodes checks how each of
// payment-resource's refusals of the claim and of the result ends the
// execution: final (acknowledged), fenced out, or redelivered.
func TestPaymentResourceAnswersAreClassifiedByTheirCodes(t *testing.T) {
	ack := `{"status":"ACK","railRef":"rail-000001"}`
	for _, c := range []struct {
		name       string
		deps       func() *fakeDeps
		wantOut    executor.Outcome
		wantErr    error // nil: a final outcome
		wantStatus int
		rail       int
	}{
		{"claim fenced out for the current holder", func() *fakeDeps { return &fakeDeps{claimCode: api.CodeFencedOut} }, executor.OutcomeNeedsAttention, nil, 200, 0},
		{"claim of a payout needing attention", func() *fakeDeps { return &fakeDeps{claimCode: api.CodePayoutNeedsAttention} }, executor.OutcomeNeedsAttention, nil, 200, 0},
		{"claim of a finished payout", func() *fakeDeps { return &fakeDeps{claimCode: api.CodePayoutFinished} }, executor.OutcomeAlreadyDone, nil, 200, 0},
		{"claim refused as invalid", func() *fakeDeps { return &fakeDeps{claimCode: api.CodeInvalidRequest} }, executor.OutcomeNeedsAttention, nil, 200, 0},
		{"claim in doubt", func() *fakeDeps { return &fakeDeps{claimCode: api.CodePayoutInDoubt} }, executor.OutcomeInDoubt, nil, 200, 0},
		{"claim of an unknown payout", func() *fakeDeps { return &fakeDeps{claimCode: api.CodePayoutNotFound} }, executor.OutcomeDropped, nil, 200, 0},
		{"claim while paydb is down", func() *fakeDeps { return &fakeDeps{claimCode: api.CodeUnavailable} }, "", executor.ErrDependency, 503, 0},
		{"result fenced out for the current holder", func() *fakeDeps { return &fakeDeps{railStatus: 200, railBody: ack, resultCode: api.CodeFencedOut} }, executor.OutcomeNeedsAttention, nil, 200, 1},
		{"result with a rail reference recorded elsewhere", func() *fakeDeps {
			return &fakeDeps{railStatus: 200, railBody: ack, resultCode: api.CodeRailRefConflict}
		}, executor.OutcomeNeedsAttention, nil, 200, 1},
		{"result for a payout not claimed", func() *fakeDeps {
			return &fakeDeps{railStatus: 200, railBody: ack, resultCode: api.CodePayoutNotClaimed}
		}, executor.OutcomeNeedsAttention, nil, 200, 1},
		{"result while paydb is down", func() *fakeDeps { return &fakeDeps{railStatus: 200, railBody: ack, resultCode: api.CodeUnavailable} }, "", executor.ErrDependency, 503, 1},
		{"needs_attention mark while paydb is down", func() *fakeDeps {
			return &fakeDeps{railStatus: 200, railBody: ack, resultCode: api.CodeRailRefConflict, attnCode: api.CodeUnavailable}
		}, "", executor.ErrDependency, 503, 1},
		{"needs_attention mark refused by the payout's fence", func() *fakeDeps {
			return &fakeDeps{claimCode: api.CodeFencedOut, attnCode: api.CodeFencedOut}
		}, executor.OutcomeNeedsAttention, nil, 200, 0},
		{"result of a finished payout", func() *fakeDeps { return &fakeDeps{railStatus: 200, railBody: ack, resultCode: api.CodePayoutFinished} }, executor.OutcomeAlreadyDone, nil, 200, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			deps := c.deps()
			x, _ := newExecutor(t, deps, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			out, err := x.Execute(ctx, event)
			if out != c.wantOut || !errors.Is(err, c.wantErr) || (c.wantErr == nil) != (err == nil) {
				t.Fatalf("Execute = %q, %v; want %q, %v", out, err, c.wantOut, c.wantErr)
			}
			if got := executor.Status(out, err); got != c.wantStatus {
				t.Errorf("push status %d, want %d", got, c.wantStatus)
			}
			if n := deps.railCalls(); n != c.rail {
				t.Errorf("rail-proxy called %d times, want %d", n, c.rail)
			}
		})
	}
}

// dataPush returns a push body whose message data is data, whatever it
// holds.
func dataPush(data string) string {
	b, _ := payoutevent.EncodeRaw([]byte(data), nil, "m-1", "", 0)
	return string(b)
}

func TestMalformedPushIsAckedAndBadMethodRefused(t *testing.T) {
	deps := &fakeDeps{}
	x, _ := newExecutor(t, deps, nil)
	for _, body := range []string{`{"message":{"data":"!!!"}}`, `{"message":{"data":"e30="}}`,
		dataPush(`{"payoutId":"p-1","accountId":"acct-1","amountMinor":5,"currency":"EUR"} trailing`),
		dataPush(`{"payoutId":"p-1","accountId":"acct-1","accountId":"acct-2","amountMinor":5,"currency":"EUR"}`),
	} {
		if rec := push(t, x, []byte(body)); rec.Code != http.StatusNoContent {
			t.Errorf("malformed push %s answered %d; want 204 (acked, never redelivered)", body, rec.Code)
		}
	}
	// A body that is not a push envelope at all comes from no Pub/Sub:
	// refused 400 with the envelope.
	for _, body := range []string{`{`, dataPush(`{}`) + ` trailing`, `{"message":{"data":"e30="},"message":{"data":"e30="}}`} {
		rec := push(t, x, []byte(body))
		var env jsonhandler.Envelope
		if err := json.Unmarshal(rec.Body.Bytes(), &env); rec.Code != http.StatusBadRequest || err != nil || env.Error.Code != jsonhandler.CodeInvalidRequest {
			t.Errorf("broken envelope %s answered %d %s; want 400 with the envelope and %s", body, rec.Code, rec.Body, jsonhandler.CodeInvalidRequest)
		}
	}
	rec := httptest.NewRecorder()
	x.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET answered %d; want 405", rec.Code)
	}
	if len(deps.calls) != 0 {
		t.Fatalf("malformed pushes reached dependencies: %v", deps.calls)
	}
}

func TestLockBusyIsRetried(t *testing.T) {
	deps := &fakeDeps{}
	x, store := newExecutor(t, deps, nil)
	if _, err := store.Acquire(context.Background(), "payout:acct-7", "someone-else", time.Minute); err != nil {
		t.Fatal(err)
	}
	out, err := x.Execute(t.Context(), event)
	if !errors.Is(err, executor.ErrLockBusy) || executor.Status(out, err) != http.StatusServiceUnavailable {
		t.Fatalf("Execute = %q, %v; want ErrLockBusy and 503", out, err)
	}
}

func TestConfig(t *testing.T) {
	env := map[string]string{"LOCK_SERVER_URL": "http://a", "PAYMENT_RESOURCE_URL": "http://b", "RAIL_PROXY_URL": "http://c", "LEASE_TTL_MS": "3000"}
	c, err := executor.LoadConfig(func(k string) string { return env[k] })
	if err != nil || c.LeaseTTL != 3*time.Second {
		t.Fatalf("LoadConfig = %+v, %v", c, err)
	}
	for k, v := range map[string]string{"LEASE_TTL_MS": "100", "RAIL_PROXY_URL": "ftp://x", "ACQUIRE_WAIT_MS": "soon", "EXECUTOR_ID": "a b"} {
		bad := map[string]string{}
		for kk, vv := range env {
			bad[kk] = vv
		}
		bad[k] = v
		if _, err := executor.LoadConfig(func(k string) string { return bad[k] }); !errors.Is(err, executor.ErrInvalidConfig) {
			t.Errorf("LoadConfig(%s=%q) = %v, want ErrInvalidConfig", k, v, err)
		}
	}
}

// TestLoadConfigReportsEveryInvalidVariable: one run of LoadConfig names
// every variable to fix (two that do not parse, one missing URL).
func TestLoadConfigReportsEveryInvalidVariable(t *testing.T) {
	env := map[string]string{lockapi.EnvServerURL: "http://a", executor.EnvPaymentResourceURL: "http://b",
		executor.EnvLeaseTTLMs: "ten", executor.EnvAcquireWaitMs: "soon"}
	_, err := executor.LoadConfig(func(k string) string { return env[k] })
	if !errors.Is(err, executor.ErrInvalidConfig) {
		t.Fatalf("LoadConfig error = %v, want ErrInvalidConfig", err)
	}
	for _, name := range []string{executor.EnvLeaseTTLMs, executor.EnvAcquireWaitMs, executor.EnvRailProxyURL} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("LoadConfig error %q does not name %s", err, name)
		}
	}
}

// TestEnvNamesListsEveryVariableLoadConfigReads keeps the list the unknown
// variable warning uses equal to what LoadConfig reads.
func TestEnvNamesListsEveryVariableLoadConfigReads(t *testing.T) {
	read := map[string]bool{}
	_, _ = executor.LoadConfig(func(k string) string { read[k] = true; return "" })
	names := executor.EnvNames()
	for k := range read {
		if !slices.Contains(names, k) {
			t.Errorf("LoadConfig reads %s, EnvNames does not list it", k)
		}
	}
	if len(names) != len(read) {
		t.Errorf("EnvNames = %v, LoadConfig reads %v", names, read)
	}
}

// An event that names another account, amount or currency than its
// payout's (forged, or corrupted) is dropped: payment-resource refuses
// the claim that carries its terms (PAYOUT_TERMS_MISMATCH), nothing is
// claimed or sent to the rail, and the lock the event named, taken for
// the claim, is released.
func TestEventThatDoesNotMatchItsPayoutIsDropped(t *testing.T) {
	for _, forged := range []payoutevent.Event{
		{PayoutID: "p-1", AccountID: "acct-9", AmountMinor: 2500, Currency: "EUR"},
		{PayoutID: "p-1", AccountID: "acct-7", AmountMinor: 900000, Currency: "EUR"},
		{PayoutID: "p-1", AccountID: "acct-7", AmountMinor: 2500, Currency: "USD"},
	} {
		t.Run(fmt.Sprintf("%s %d %s", forged.AccountID, forged.AmountMinor, forged.Currency), func(t *testing.T) {
			deps := &fakeDeps{railStatus: 200, railBody: `{"status":"ACK","railRef":"r"}`}
			store := memstore.New(nil)
			var logs logtest.Buffer
			x := loggedExecutor(t, store, nil, deps, &logs, nil)
			out, err := x.Execute(t.Context(), forged)
			if err != nil || out != executor.OutcomeDropped {
				t.Fatalf("Execute(forged) = %q, %v; want dropped", out, err)
			}
			if err := x.Close(t.Context()); err != nil { // the release follows the answer
				t.Fatal(err)
			}
			want := api.ClaimRequest{AccountID: forged.AccountID, AmountMinor: forged.AmountMinor, Currency: forged.Currency}
			if len(deps.claims) != 1 || deps.claims[0] != want || deps.claimed != 0 {
				t.Fatalf("claims %v, %d accepted; want one refused, carrying the event's terms %v", deps.claims, deps.claimed, want)
			}
			if n := deps.railCalls(); n != 0 || len(deps.results) != 0 || len(deps.attentions) != 0 {
				t.Fatalf("forged event reached the rail %d times, results %v, marks %v", n, deps.results, deps.attentions)
			}
			if st, _ := store.Inspect(context.Background(), forged.LockKey()); st.Lease != nil || st.LastToken == 0 {
				t.Fatalf("%s after the forged event: %+v; want taken for the claim, then released", forged.LockKey(), st)
			}
			lines := logs.Events(t, executor.EventPayoutEventMismatch)
			if len(lines) != 1 || lines[0]["level"] != "ERROR" {
				t.Fatalf("%s lines %v; want one at ERROR", executor.EventPayoutEventMismatch, lines)
			}
		})
	}
}

func TestCloudEventFormsAreAccepted(t *testing.T) {
	for _, structured := range []bool{false, true} {
		deps := &fakeDeps{railStatus: 200, railBody: `{"status":"ACK","railRef":"rail-000001"}`}
		x, _ := newExecutor(t, deps, nil)
		body, _ := payoutevent.Encode(event, "m-1", "acct-7", 0)
		req := httptest.NewRequest("POST", "/", bytes.NewReader(body))
		req.Header.Set("ce-specversion", "1.0")
		req.Header.Set("ce-type", "google.cloud.pubsub.topic.v1.messagePublished")
		req.Header.Set("Content-Type", "application/json")
		if structured {
			wrapped, _ := json.Marshal(map[string]any{"specversion": "1.0", "type": "google.cloud.pubsub.topic.v1.messagePublished",
				"source": "//pubsub.googleapis.com/projects/local/topics/payouts", "id": "m-1", "data": json.RawMessage(body)})
			req = httptest.NewRequest("POST", "/", bytes.NewReader(wrapped))
			req.Header.Set("Content-Type", "application/cloudevents+json")
		}
		rec := httptest.NewRecorder()
		x.ServeHTTP(rec, req)
		if rec.Code != 200 || len(deps.results) != 1 {
			t.Fatalf("structured=%v: %d %s, results %v; want the payout posted", structured, rec.Code, rec.Body, deps.results)
		}
	}
}

// TestDeliveriesAreCountedByResult: each push request answered moves
// executor_deliveries_total for its result, and nothing else.
func TestDeliveriesAreCountedByResult(t *testing.T) {
	reg := prometheus.NewRegistry()
	for _, c := range executor.Collectors() {
		if err := reg.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	count := func(result string) float64 {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() != "executor_deliveries_total" {
				continue
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() != "result" {
						t.Fatalf("%s has label %q", f.GetName(), l.GetName())
					}
					if l.GetValue() == result {
						return m.GetCounter().GetValue()
					}
				}
			}
		}
		t.Fatalf("no series for result %q", result)
		return 0
	}
	before := map[string]float64{}
	for _, r := range []string{"posted", "needs_attention", "dropped", "rejected"} {
		before[r] = count(r)
	}
	posted := &fakeDeps{railStatus: 200, railBody: `{"status":"ACK","railRef":"rail-000001"}`}
	x, _ := newExecutor(t, posted, nil)
	body, _ := payoutevent.Encode(event, "m-1", "acct-7", 1)
	push(t, x, body)
	fenced := &fakeDeps{railStatus: 409, railBody: `{"error":{"code":"FENCED_OUT","message":"stale","retryable":false}}`}
	y, _ := newExecutor(t, fenced, nil)
	push(t, y, body)
	push(t, y, body)
	push(t, y, []byte(`{"message":{"data":"e30="}}`)) // an empty event: dropped
	push(t, y, []byte(`{"message":`))                 // not a push: rejected
	rec := httptest.NewRecorder()
	y.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	for r, want := range map[string]float64{"posted": 1, "needs_attention": 2, "dropped": 1, "rejected": 2} {
		if got := count(r) - before[r]; got != want {
			t.Errorf("executor_deliveries_total{result=%q} went up by %v; want %v", r, got, want)
		}
	}
}

// TestRailProxyAnswersAreClassifiedByTheirCodes checks how each answer of
// rail-proxy to the submission ends the execution: a result reported
// (posted, declined or in doubt), fenced out, or redelivered
// (ErrDependency: a lost or unreadable answer, a 5xx other than
// RAIL_AMBIGUOUS, a refusal without its first attempt, so that asking
// again is safe).
func TestRailProxyAnswersAreClassifiedByTheirCodes(t *testing.T) {
	env := func(code railapi.Code) string {
		b, _ := json.Marshal(railapi.ErrorEnvelope{Error: railapi.ErrorBody{Code: code, Message: "scripted", Retryable: code.Retryable()}})
		return string(b)
	}
	for _, c := range []struct {
		name        string
		status      int
		body        string
		wantOut     executor.Outcome
		wantErr     error // nil: a final outcome
		wantOutcome string
	}{
		{"ACK", 200, `{"status":"ACK","railRef":"rail-000001","attemptId":1,"token":1}`, executor.OutcomePosted, nil, "ACK"},
		{"DECLINE", 200, `{"status":"DECLINE","railRef":"rail-000001","attemptId":1,"token":1}`, executor.OutcomeDeclined, nil, "DECLINE"},
		{"RAIL_AMBIGUOUS", 502, env(railapi.CodeRailAmbiguous), executor.OutcomeInDoubt, nil, "AMBIGUOUS"},
		{"FENCED_OUT for the current holder", 409, env(railapi.CodeFencedOut), executor.OutcomeNeedsAttention, nil, ""},
		{"answer lost", -1, "", "", executor.ErrDependency, ""},
		{"unreadable 200", 200, `{"status":`, "", executor.ErrDependency, ""},
		{"200 with another status", 200, `{"status":"MAYBE","railRef":"r"}`, "", executor.ErrDependency, ""},
		{"502 without a code", 502, "<html>bad gateway</html>", "", executor.ErrDependency, ""},
		{"UNAVAILABLE", 503, env(railapi.CodeUnavailable), "", executor.ErrDependency, ""},
		{"RAILDB_RESTORED", 503, env(railapi.CodeRestored), "", executor.ErrDependency, ""},
		{"INTERNAL", 500, env(railapi.CodeInternal), "", executor.ErrDependency, ""},
		// Nothing reached the rail and rail-proxy released the forward:
		// redelivered, never recorded ambiguous (which would end failed).
		{"RAIL_NOT_REACHED", 503, env(railapi.CodeRailNotReached), "", executor.ErrDependency, ""},
		// Stopped by a reconciliation: nothing moved, for good; handed to
		// the reconciler as ambiguous.
		{"PAYOUT_STOPPED", 409, env(railapi.CodePayoutStopped), executor.OutcomeInDoubt, nil, "AMBIGUOUS"},
		{"INVALID_TOKEN (a wrong deployment)", 400, env(railapi.CodeInvalidToken), "", executor.ErrDependency, ""},
		{"INVALID_REQUEST", 400, env(railapi.CodeInvalidRequest), executor.OutcomeNeedsAttention, nil, ""},
		{"a code this executor does not know, 4xx", 409, `{"error":{"code":"SOMETHING_NEW","message":"x","retryable":false}}`, executor.OutcomeNeedsAttention, nil, ""},
		{"a code this executor does not know, 5xx", 503, `{"error":{"code":"SOMETHING_NEW","message":"x","retryable":false}}`, "", executor.ErrDependency, ""},
		{"NOT_FOUND (a wrong deployment)", 404, env(railapi.CodeNotFound), "", executor.ErrDependency, ""},
		{"PAYOUT_ALREADY_SUBMITTED without its attempt", 409, env(railapi.CodeAlreadySubmitted), "", executor.ErrDependency, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			deps := &fakeDeps{railStatus: c.status, railBody: c.body}
			x, _ := newExecutor(t, deps, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			out, err := x.Execute(ctx, event)
			if out != c.wantOut || !errors.Is(err, c.wantErr) || (c.wantErr == nil) != (err == nil) {
				t.Fatalf("Execute = %q, %v; want %q, %v", out, err, c.wantOut, c.wantErr)
			}
			if n := deps.railCalls(); n != 1 {
				t.Errorf("rail-proxy called %d times, want 1", n)
			}
			if c.wantOutcome == "" && len(deps.results) != 0 {
				t.Errorf("results %v; want none", deps.results)
			}
			if c.wantOutcome != "" && (len(deps.results) != 1 || deps.results[0]["outcome"] != c.wantOutcome) {
				t.Errorf("results %v; want one %s", deps.results, c.wantOutcome)
			}
		})
	}
}

// unrecordedCount reads executor_attention_unrecorded_total{reason} from
// reg (which holds executor.Collectors()).
func unrecordedCount(t *testing.T, reg *prometheus.Registry, reason api.AttentionReason) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != executor.MetricAttentionUnrecorded {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() != "reason" {
					t.Fatalf("%s has label %q", f.GetName(), l.GetName())
				}
				if l.GetValue() == string(reason) {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s series for reason %q", executor.MetricAttentionUnrecorded, reason)
	return 0
}

// TestUnrecordedAttentionIsCounted (the game day's finding): a
// payout the executor judges to need attention but cannot mark so is
// acknowledged all the same, so the counter is the only signal that it is
// stuck. Both paths count, by reason: the mark refused by
// payment-resource's fence (the holder of the current lease fenced out at
// the claim and at the mark: a fence above every grant), and a permanent
// refusal before any lease is held (nothing can be written). A mark that
// is written counts nothing, and every reason is served from the start,
// at 0, so that the first unrecorded payout is an increase an alert sees.
func TestUnrecordedAttentionIsCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	for _, c := range executor.Collectors() {
		if err := reg.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range api.AttentionReasons {
		unrecordedCount(t, reg, r) // present before anything happened
	}
	// A newer lock-server's refusal of the acquire: a 4xx with a code this
	// executor does not know (permanent, unclassified), before any lease.
	newerRefusal := func(ls http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if lockOp(r) == "acquire" {
				jsonhandler.WriteError(w, http.StatusConflict, "NEWER_CODE", "scripted", false)
				return
			}
			ls.ServeHTTP(w, r)
		})
	}
	for _, c := range []struct {
		name   string
		lock   func(http.Handler) http.Handler
		deps   *fakeDeps
		reason api.AttentionReason
		want   float64
	}{
		{"mark refused by the fence ahead of the lease", nil, &fakeDeps{claimCode: api.CodeFencedOut, attnCode: api.CodeFencedOut}, api.ReasonPaymentFenceAhead, 1},
		{"permanent refusal before the lease", newerRefusal, &fakeDeps{}, api.ReasonUnclassified, 1},
		{"mark written", nil, &fakeDeps{claimCode: api.CodeFencedOut}, api.ReasonPaymentFenceAhead, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := unrecordedCount(t, reg, c.reason)
			x := loggedExecutor(t, memstore.New(nil), c.lock, c.deps, io.Discard, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if out, err := x.Execute(ctx, event); out != executor.OutcomeNeedsAttention || err != nil {
				t.Fatalf("Execute = %q, %v; want %q (acknowledged)", out, err, executor.OutcomeNeedsAttention)
			}
			if got := unrecordedCount(t, reg, c.reason) - before; got != c.want {
				t.Errorf("%s{reason=%q} went up by %v; want %v", executor.MetricAttentionUnrecorded, c.reason, got, c.want)
			}
		})
	}
}

// A newcomer probe: a stale worker (its lease
// revoked and the lock granted to a newer holder before its submission)
// whose report payment-resource then refused for good (here
// RAIL_REF_CONFLICT) logged "refusal no retry can change" at ERROR and
// marked the payout needs_attention with its stale token. The refusal may
// be the newer holder's doing; only the current holder decides. Now the
// lease is confirmed first: the log says what happened (fenced out by a
// newer holder, payout_fenced_stale at WARN), nothing is marked, and the
// delivery is redelivered (409).
func TestStaleHolderRefusedForGoodIsFencedOutNotMarked(t *testing.T) {
	deps := &fakeDeps{railStatus: 200, railBody: `{"status":"ACK","railRef":"rail-000001"}`, resultCode: api.CodeRailRefConflict}
	store := memstore.New(nil)
	var logs logtest.Buffer
	x := loggedExecutor(t, store, nil, deps, &logs, staleBeforeSubmit(t, &store))
	out, err := x.Execute(t.Context(), event)
	if !errors.Is(err, executor.ErrFencedOut) || executor.Status(out, err) != http.StatusConflict {
		t.Fatalf("Execute = %q, %v; want ErrFencedOut and 409 so that Pub/Sub redelivers", out, err)
	}
	if len(deps.attentions) != 0 {
		t.Fatalf("the stale worker marked the payout: %v", deps.attentions)
	}
	if n := len(logs.Events(t, executor.EventPayoutRefusedPermanently)); n != 0 {
		t.Fatalf("%d %s lines; want none: the refusal was answered to a stale holder", n, executor.EventPayoutRefusedPermanently)
	}
	lines := logs.Events(t, executor.EventPayoutFencedStale)
	if len(lines) != 1 || lines[0]["level"] != "WARN" || !strings.Contains(lines[0]["msg"].(string), "fenced out by a newer holder") {
		t.Fatalf("%s lines %v; want one at WARN saying the worker was fenced out by a newer holder", executor.EventPayoutFencedStale, lines)
	}
}

// A probe: a POST to any path was acknowledged 204 (a push to
// "/foo" dropped like a malformed message), and an oversized body was
// answered with net/http's own text. Now another path gets 404 with the
// envelope and reaches no dependency, a query string on the push path is
// still accepted (Pub/Sub push URLs may carry one), and the 413 says the
// limit in the envelope's own words.
func TestUnknownPathsAreNotFoundAndOversizedBodiesSayTheLimit(t *testing.T) {
	deps := &fakeDeps{}
	x, _ := newExecutor(t, deps, nil)
	malformed := []byte(`{"message":{"data":"e30="}}`) // acked 204 on the push path
	for _, path := range []string{"/foo", "/v1/payouts", "//", "/foo?x=1"} {
		rec := httptest.NewRecorder()
		x.ServeHTTP(rec, httptest.NewRequest("POST", path, bytes.NewReader(malformed)))
		var env jsonhandler.Envelope
		if err := json.Unmarshal(rec.Body.Bytes(), &env); rec.Code != http.StatusNotFound || err != nil || env.Error.Code != string(api.CodeNotFound) {
			t.Errorf("POST %s answered %d %s; want 404 with the envelope and %s", path, rec.Code, rec.Body, api.CodeNotFound)
		}
	}
	rec := httptest.NewRecorder()
	x.ServeHTTP(rec, httptest.NewRequest("POST", executor.PushPath+"?token=abc", bytes.NewReader(malformed)))
	if rec.Code != http.StatusNoContent {
		t.Errorf("a push with a query string answered %d %s; want 204", rec.Code, rec.Body)
	}
	rec = push(t, x, bytes.Repeat([]byte(" "), 1<<20))
	var env jsonhandler.Envelope
	if err := json.Unmarshal(rec.Body.Bytes(), &env); rec.Code != http.StatusRequestEntityTooLarge || err != nil || env.Error.Code != jsonhandler.CodeBodyTooLarge ||
		!strings.HasPrefix(env.Error.Message, "body larger than ") || strings.Contains(env.Error.Message, "http:") {
		t.Errorf("an oversized push answered %d %s; want 413 %s saying the limit, no Go text", rec.Code, rec.Body, jsonhandler.CodeBodyTooLarge)
	}
	if len(deps.calls) != 0 {
		t.Fatalf("refused requests reached dependencies: %v", deps.calls)
	}
}
