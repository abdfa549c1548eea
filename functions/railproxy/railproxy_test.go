package railproxy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/logjson"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/logtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// No goroutine outlives the tests: a Proxy starts no goroutine; its pool's and the rail client's end with Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(pgtest.Tests(m),
		// The Cloud SQL connector (internal/pgpool) links OpenCensus, whose
		// view worker starts once per process and never stops.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"))
}

// rig is one test's world: a fresh raildb, a real rail stub on an
// httptest server, and the proxies built over them.
type rig struct {
	t      *testing.T
	dsn    string
	stub   *railstub.Stub
	rail   *httptest.Server
	logs   *logtest.Buffer
	db     *pgxpool.Pool // for the test's own checks
	dbOnce sync.Once
}

func newRig(t *testing.T) *rig {
	t.Helper()
	stub, err := railstub.New(railstub.DefaultConfig(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(stub)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { _ = stub.Close() }) // runs first: releases held requests
	return &rig{t: t, dsn: pgtest.NewDatabase(t), stub: stub, rail: srv, logs: &logtest.Buffer{}}
}

// proxy returns a new Proxy over the rig's database and rail, closed when
// the test ends; mod adjusts its config.
func (r *rig) proxy(mod func(*railproxy.Config)) *railproxy.Proxy {
	r.t.Helper()
	cfg := railproxy.DefaultConfig()
	cfg.DB.DSN = r.dsn
	cfg.RailURL = r.rail.URL
	cfg.ProofKeys, cfg.ReceiptKey = fencingtest.ProofKeys(), fencingtest.ReceiptSigningKey()
	cfg.TermsKeys = fencingtest.TermsKeys()
	// No early stall detection unless a test asks for it: under -race on a
	// starved machine, raildb can take longer than StallAfter to answer
	// anything, even a ping, and a test of the fence would meet a
	// (correct, retryable) 503 it does not expect. stall_test.go sets it.
	cfg.StallAfter = 0
	if mod != nil {
		mod(&cfg)
	}
	// logjson as in production: a line logged with a traced context
	// carries the trace id (tracelog_test.go).
	log := logjson.New(r.logs, slog.LevelDebug, false)
	p, err := railproxy.New(r.t.Context(), cfg, log)
	if err != nil {
		r.t.Fatalf("railproxy.New: %v", err)
	}
	r.t.Cleanup(func() { _ = p.Close() })
	return p
}

func (r *rig) pool() *pgxpool.Pool {
	r.dbOnce.Do(func() {
		p, err := pgxpool.New(context.Background(), r.dsn)
		if err != nil {
			r.t.Fatal(err)
		}
		r.t.Cleanup(p.Close)
		r.db = p
	})
	return r.db
}

func (r *rig) attemptRows() int {
	r.t.Helper()
	var n int
	if err := r.pool().QueryRow(r.t.Context(), "SELECT count(*) FROM rail_attempt").Scan(&n); err != nil {
		r.t.Fatal(err)
	}
	return n
}

func (r *rig) attemptStates() map[api.State]int {
	r.t.Helper()
	rows, err := r.pool().Query(r.t.Context(), "SELECT state, count(*) FROM rail_attempt GROUP BY state")
	if err != nil {
		r.t.Fatal(err)
	}
	defer rows.Close()
	out := map[api.State]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			r.t.Fatal(err)
		}
		out[api.State(s)] = n
	}
	return out
}

// highWater reads the account's high-water through the API (-1 for 404).
func highWater(t *testing.T, h http.Handler, account string) int64 {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", api.HighWaterPath(account), nil))
	if rec.Code == http.StatusNotFound {
		return -1
	}
	var hw api.HighWater
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &hw) != nil || hw.AccountID != account {
		t.Fatalf("GET high-water %s: %d %s", account, rec.Code, rec.Body)
	}
	return hw.HighWater
}

// withProof adds lock-server's proof of the one token in tokens on the
// lock of body's account (payout:{accountId}), signed with the test key;
// nothing when there is not exactly one valid token or no account.
func withProof(req *http.Request, body string, tokens []string) {
	var sub struct {
		AccountID string `json:"accountId"`
	}
	tok, err := strconv.ParseInt(strings.Join(tokens, ""), 10, 64)
	if len(tokens) != 1 || err != nil || tok <= 0 || json.Unmarshal([]byte(body), &sub) != nil {
		return
	}
	req.Header.Set(fencewire.HeaderProof, fencingtest.Proof(sub.AccountID, tok))
}

// body is the submission of a payout payment-resource created: its terms
// signed with the test terms key. The signature is written as the body
// member termsSignature (BodyTermsSignature), which submit moves to
// the header api.HeaderTermsSignature, as the executor sends it.
func body(payout, account string, amount int64) string {
	req := api.SubmitRequest{PayoutID: payout, AccountID: account, AmountMinor: amount, Currency: "EUR"}
	req.BodyTermsSignature = fencingtest.Terms(req.Terms())
	b, _ := json.Marshal(req)
	return string(b)
}

// termsToHeader returns body without its termsSignature member and that
// member's value, when body is a JSON object whose termsSignature is a
// string; otherwise body unchanged and "".
func termsToHeader(body string) (string, string) {
	var m map[string]json.RawMessage
	var sig string
	if json.Unmarshal([]byte(body), &m) != nil || json.Unmarshal(m["termsSignature"], &sig) != nil {
		return body, ""
	}
	delete(m, "termsSignature")
	b, _ := json.Marshal(m)
	return string(b), sig
}

// submit posts body with the given token headers (none when tokens is
// empty) and owner; a string termsSignature member of body is sent in
// the header api.HeaderTermsSignature instead (submitLegacy sends it as
// it is). With one token, it also sends lock-server's proof of
// it on the lock of the body's account, as an honest holder would (see
// withProof).
func submit(h http.Handler, owner, body string, tokens ...string) *httptest.ResponseRecorder {
	body, sig := termsToHeader(body)
	return submitWith(h, owner, body, sig, tokens...)
}

// submitLegacy is submit with the body as it is: a termsSignature member
// stays in the body, as the previous version's executor sends it.
func submitLegacy(h http.Handler, owner, body string, tokens ...string) *httptest.ResponseRecorder {
	return submitWith(h, owner, body, "", tokens...)
}

// submitWith is submit with the header api.HeaderTermsSignature set to
// sig (none when sig is "").
func submitWith(h http.Handler, owner, body, sig string, tokens ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("POST", api.PathSubmissions, strings.NewReader(body))
	if sig != "" {
		req.Header.Set(api.HeaderTermsSignature, sig)
	}
	req.Header.Set("Content-Type", "application/json")
	for _, tok := range tokens {
		req.Header.Add(fencewire.HeaderToken, tok)
	}
	withProof(req, body, tokens)
	if owner != "" {
		req.Header.Set(fencewire.HeaderOwner, owner)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func mustAccept(t *testing.T, h http.Handler, owner, body string, token int64) api.SubmitAnswer {
	t.Helper()
	rec := submit(h, owner, body, strconv.FormatInt(token, 10))
	var ans api.SubmitAnswer
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &ans) != nil {
		t.Fatalf("token %d: status %d, body %s; want 200", token, rec.Code, rec.Body)
	}
	if ans.Token != token || ans.AttemptID <= 0 || ans.RailRef == "" {
		t.Fatalf("token %d: answer %+v", token, ans)
	}
	return ans
}

func envelope(t *testing.T, rec *httptest.ResponseRecorder) api.ErrorBody {
	t.Helper()
	var env api.ErrorEnvelope
	if err := json.Unmarshal(rec.Body.Bytes(), &env); err != nil || env.Error.Code == "" {
		t.Fatalf("body %q is not an error envelope (err %v)", rec.Body, err)
	}
	return env.Error
}

func mustBeFenced(t *testing.T, rec *httptest.ResponseRecorder) {
	t.Helper()
	if rec.Code != http.StatusConflict {
		t.Fatalf("status %d, body %s; want 409 %s", rec.Code, rec.Body, api.CodeFencedOut)
	}
	if e := envelope(t, rec); e.Code != api.CodeFencedOut || e.Retryable {
		t.Fatalf("envelope %+v; want %s, not retryable", e, api.CodeFencedOut)
	}
}

func TestStaleHolderIsFencedAtRailProxy(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	if hw := highWater(t, p, "acct-1"); hw != -1 {
		t.Fatalf("high-water before any submission: %d, want 404", hw)
	}

	// Worker B holds the lock with token 42 and submits payout po-1.
	ans := mustAccept(t, p, "worker-b", body("po-1", "acct-1", 2500), 42)
	if ans.Status != api.RailAck {
		t.Fatalf("answer %+v, want ACK", ans)
	}
	// Worker A, paused while its lease (token 41) expired, wakes up and
	// submits the same payout.
	mustBeFenced(t, submit(p, "worker-a", body("po-1", "acct-1", 2500), "41"))

	fenced := r.logs.Events(t, fencewire.EventFencedOut)
	if len(fenced) != 1 {
		t.Fatalf("got %d fenced_out log lines, want 1", len(fenced))
	}
	want := map[string]any{"resource": "rail", "resourceId": "acct-1", "presentedToken": 41.0, "highestToken": 42.0, "ownerId": "worker-a", "payoutId": "po-1"}
	for k, v := range want {
		if fenced[0][k] != v {
			t.Errorf("fenced_out %s = %v, want %v (line %v)", k, fenced[0][k], v, fenced[0])
		}
	}
	if got := r.stub.Submissions(""); len(got) != 1 || got[0].Request.Reference != "po-1" {
		t.Fatalf("rail records %+v; want exactly one submission, reference po-1", got)
	}
	if hw := highWater(t, p, "acct-1"); hw != 42 {
		t.Fatalf("high-water %d, want 42", hw)
	}

	// The audit keeps both attempts.
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, httptest.NewRequest("GET", api.AttemptsPath("po-1"), nil))
	var list api.AttemptList
	if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &list) != nil {
		t.Fatalf("GET attempts: %d %s", rec.Code, rec.Body)
	}
	if len(list.Attempts) != 2 {
		t.Fatalf("attempts %+v, want 2", list.Attempts)
	}
	a, f := list.Attempts[0], list.Attempts[1]
	if a.Token != 42 || a.State != api.StateAcked || a.RailRef != ans.RailRef || a.OwnerID != "worker-b" || a.FinishedAt == nil || a.AmountMinor != 2500 || a.Currency != "EUR" {
		t.Errorf("accepted attempt %+v", a)
	}
	if f.Token != 41 || f.State != api.StateFenced || f.RailRef != "" || f.OwnerID != "worker-a" || f.FinishedAt == nil {
		t.Errorf("fenced attempt %+v", f)
	}
	for _, ev := range []string{api.EventSubmissionForwarding, api.EventSubmissionAcked} {
		lines := r.logs.Events(t, ev)
		if len(lines) != 1 || lines[0]["token"] != 42.0 || lines[0]["payoutId"] != "po-1" || lines[0]["accountId"] != "acct-1" || lines[0]["ownerId"] != "worker-b" {
			t.Errorf("%s log lines %v; want one with token 42, po-1, acct-1, worker-b", ev, lines)
		}
	}
}

func TestEqualTokenIsFenced(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	mustAccept(t, p, "w", body("po-1", "acct-1", 100), 42)
	// The same token again (a retry, or a second worker claiming the same
	// grant) is stale: the fence is strict.
	mustBeFenced(t, submit(p, "w", body("po-2", "acct-1", 100), "42"))
	if n := len(r.stub.Submissions("")); n != 1 {
		t.Fatalf("rail received %d submissions, want 1", n)
	}
	// Another account has a fence of its own.
	mustAccept(t, p, "w", body("po-3", "acct-2", 100), 7)
}

// TestAHoldersResendOfItsOwnSubmissionIsNotStale (probe 3): a refused
// PAYOUT_ALREADY_SUBMITTED raises the high-water to the newer holder's
// token (the fence learns a newer holder exists), and that holder's resend
// of its own submission, with the same token, gets the already-submitted
// answer again, never FENCED_OUT for its own token. The same token for
// another payout is still stale.
func TestAHoldersResendOfItsOwnSubmissionIsNotStale(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	first := mustAccept(t, p, "worker-a", body("po-1", "acct-1", 100), 11)
	for i := range 2 {
		rec := submit(p, "worker-b", body("po-1", "acct-1", 100), "12")
		var ans api.AlreadySubmittedAnswer
		if rec.Code != http.StatusConflict || json.Unmarshal(rec.Body.Bytes(), &ans) != nil ||
			ans.Error.Code != api.CodeAlreadySubmitted || ans.Attempt.AttemptID != first.AttemptID || ans.Attempt.State != api.StateAcked {
			t.Fatalf("submission %d of po-1 with token 12: %d %s; want 409 %s with attempt %d, acked", i+1, rec.Code, rec.Body,
				api.CodeAlreadySubmitted, first.AttemptID)
		}
		// A 4xx message carries no Go package name (a probe once
		// read "railproxy: payout already submitted: ...").
		if m := ans.Error.Message; strings.Contains(m, "railproxy") || !strings.HasPrefix(m, "payout already submitted: ") {
			t.Fatalf("submission %d: message %q; want it to start \"payout already submitted: \", no Go names", i+1, m)
		}
	}
	if hw := highWater(t, p, "acct-1"); hw != 12 {
		t.Fatalf("high-water %d, want 12 (the refusal taught the fence the newer token)", hw)
	}
	if got := r.logs.Events(t, fencewire.EventFencedOut); len(got) != 0 {
		t.Fatalf("fenced_out lines %v; want none: nobody stale submitted", got)
	}
	// Token 11 is stale now, and 12 cannot carry a second payout.
	mustBeFenced(t, submit(p, "worker-a", body("po-1", "acct-1", 100), "11"))
	mustBeFenced(t, submit(p, "worker-b", body("po-2", "acct-1", 100), "12"))
	if n := len(r.stub.Submissions("")); n != 1 {
		t.Fatalf("rail received %d submissions, want 1", n)
	}
}

func TestHighWaterSurvivesProxyRestart(t *testing.T) {
	r := newRig(t)
	first := r.proxy(nil)
	mustAccept(t, first, "w", body("po-1", "acct-1", 100), 42)
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if rec := submit(first, "w", body("po-9", "acct-1", 100), "99"); rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("closed proxy answered %d, want 503", rec.Code)
	}

	second := r.proxy(nil) // migrations already applied: a no-op
	mustBeFenced(t, submit(second, "w", body("po-1", "acct-1", 100), "41"))
	if hw := highWater(t, second, "acct-1"); hw != 42 {
		t.Fatalf("high-water after restart %d, want 42", hw)
	}
	if n := len(r.stub.Submissions("")); n != 1 {
		t.Fatalf("rail received %d submissions, want 1", n)
	}
}

func TestWithFencingOffTheStaleHolderReachesTheRail(t *testing.T) {
	r := newRig(t)
	p := r.proxy(func(c *railproxy.Config) { c.FencingDisabled = true })
	if len(r.logs.Events(t, api.EventFencingDisabled)) != 1 {
		t.Fatal("no fencing_disabled warning at start")
	}
	mustAccept(t, p, "worker-b", body("po-1", "acct-1", 2500), 42)
	mustAccept(t, p, "worker-a", body("po-1", "acct-1", 2500), 41)

	// The check can fail: the rail paid po-1 twice.
	if got := r.stub.Submissions("po-1"); len(got) != 2 {
		t.Fatalf("rail records of po-1: %d, want 2 (fencing off lets the stale holder through)", len(got))
	}
	// Both checks were skipped, and each said so: the stale token, and the
	// second forward of a payout that had already gone.
	if got := r.logs.Events(t, api.EventFencingBypassed); len(got) != 2 || got[0]["token"] != 41.0 || got[0]["highestToken"] != 42.0 ||
		got[1]["token"] != 41.0 || got[1]["firstToken"] != 42.0 {
		t.Fatalf("fencing_bypassed lines %v; want token 41 under high-water 42, then token 41 after the first forward with 42", got)
	}
	// The high-water kept the greatest token, so switching fencing back on
	// fences from where it stands.
	if hw := highWater(t, p, "acct-1"); hw != 42 {
		t.Fatalf("high-water %d, want 42", hw)
	}
	on := r.proxy(nil)
	mustBeFenced(t, submit(on, "worker-a", body("po-2", "acct-1", 2500), "41"))
	mustBeFenced(t, submit(on, "worker-a", body("po-2", "acct-1", 2500), "42"))
}

// setFaults posts a fault setting to the rig's rail-stub.
func (r *rig) setFaults(faults string) {
	r.t.Helper()
	resp, err := http.Post(r.rail.URL+"/admin/faults", "application/json", strings.NewReader(faults))
	if err != nil {
		r.t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != 200 {
		r.t.Fatalf("set faults: %d", resp.StatusCode)
	}
}

// deadURL is an http URL where nothing listens: a connection to it is
// refused before anything is sent.
func deadURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := "http://" + l.Addr().String()
	_ = l.Close() // nothing listens there any more
	return u
}

func TestRailFailureAfterForwardingIsAmbiguous(t *testing.T) {
	for _, tc := range []struct {
		name        string
		faults      string // POST /admin/faults body; "" for none
		rail        http.HandlerFunc
		wantRecords int
	}{
		// The rail recorded the payment and never answered.
		{name: "rail hangs", faults: `{"failNext":1,"mode":"hang"}`, wantRecords: 1},
		// A 503 that is not the rail's own "not recorded" (a proxy's, a
		// load balancer's) says nothing reliable about the money.
		{name: "rail answers a plain 503", rail: func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			http.Error(w, "upstream unavailable", http.StatusServiceUnavailable)
		}},
		// The connection is cut after the request was read: it may have
		// been recorded.
		{name: "connection reset after the request", rail: func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			railURL := r.rail.URL
			if tc.rail != nil {
				srv := httptest.NewServer(tc.rail)
				t.Cleanup(srv.Close)
				railURL = srv.URL
			}
			p := r.proxy(func(c *railproxy.Config) {
				c.RailURL = railURL
				c.RailTimeout = 500 * time.Millisecond
			})
			if tc.faults != "" {
				r.setFaults(tc.faults)
			}
			ambiguous := forwardsIn(t, api.StateAmbiguous)
			rec := submit(p, "w", body("po-1", "acct-1", 2500), "42")
			if got := forwardsIn(t, api.StateAmbiguous) - ambiguous; got != 1 {
				t.Fatalf("%s{state=%q} went up by %v; want 1", railproxy.MetricForwards, api.StateAmbiguous, got)
			}
			if rec.Code != http.StatusBadGateway {
				t.Fatalf("status %d, body %s; want 502", rec.Code, rec.Body)
			}
			if e := envelope(t, rec); e.Code != api.CodeRailAmbiguous || e.Retryable {
				t.Fatalf("envelope %+v; want %s, not retryable", e, api.CodeRailAmbiguous)
			}
			// The cause (the rail's address, the transport's error) is in
			// the log, never in the answer.
			if e := envelope(t, rec); strings.Contains(e.Message, "127.0.0.1") || strings.Contains(e.Message, "attempt") ||
				strings.Contains(e.Message, railURL) {
				t.Fatalf("502 message %q carries internal text", e.Message)
			}
			if got := r.attemptStates(); !reflect.DeepEqual(got, map[api.State]int{api.StateAmbiguous: 1}) {
				t.Fatalf("attempt states %v, want one ambiguous", got)
			}
			if got := r.logs.Events(t, api.EventSubmissionAmbiguous); len(got) != 1 || got[0]["token"] != 42.0 {
				t.Fatalf("rail_submission_ambiguous lines %v, want one with token 42", got)
			}
			recs := r.stub.Submissions("")
			if len(recs) != tc.wantRecords {
				t.Fatalf("rail records %+v, want %d", recs, tc.wantRecords)
			}
			if tc.wantRecords == 1 && (!recs[0].Withheld || recs[0].Answer.Status != rail.StatusAck) {
				t.Fatalf("rail record %+v; want a withheld ACK: the money moved", recs[0])
			}
			// The payout's forward stays with the ambiguous attempt: the
			// holder's resend gets that attempt, a newer holder too, and
			// nothing goes to the rail again.
			for _, tok := range []string{"42", "43"} {
				rec := submit(p, "w", body("po-1", "acct-1", 2500), tok)
				if e := envelope(t, rec); rec.Code != http.StatusConflict || e.Code != api.CodeAlreadySubmitted {
					t.Fatalf("resend with token %s: %d %s; want 409 %s", tok, rec.Code, rec.Body, api.CodeAlreadySubmitted)
				}
			}
			if n := len(r.stub.Submissions("")); n != tc.wantRecords {
				t.Fatalf("rail records after the resends: %d, want %d", n, tc.wantRecords)
			}
		})
	}
}

// TestRailCertainlyNotReachedIsRetryableAndReleasesTheForward: a refused
// connection (nothing sent) and the rail's own "not recorded" answer
// (rail-stub's 503 RAIL_UNAVAILABLE) are not ambiguous: the answer is 503
// RAIL_NOT_REACHED, retryable, the attempt not_sent, and the payout may go
// to the rail again, with the same token (the holder's resend) or a newer
// one, exactly once.
func TestRailCertainlyNotReachedIsRetryableAndReleasesTheForward(t *testing.T) {
	for _, tc := range []struct {
		name    string
		down    bool   // the rail's address refuses connections
		faults  string // POST /admin/faults body
		resends string // the token of the resend that reaches the rail
	}{
		{name: "connection refused, resent with the same token", down: true, resends: "42"},
		{name: "rail answers 503 " + rail.CodeUnavailable + ", resent by a newer holder", faults: `{"failNext":1,"mode":"error"}`, resends: "43"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			railURL := r.rail.URL
			if tc.down {
				railURL = deadURL(t)
			}
			p := r.proxy(func(c *railproxy.Config) { c.RailURL = railURL; c.RailTimeout = 2 * time.Second })
			if tc.faults != "" {
				r.setFaults(tc.faults)
			}
			ambiguous, notSent := forwardsIn(t, api.StateAmbiguous), forwardsIn(t, api.StateNotSent)
			rec := submit(p, "w", body("po-1", "acct-1", 2500), "42")
			if a, n := forwardsIn(t, api.StateAmbiguous)-ambiguous, forwardsIn(t, api.StateNotSent)-notSent; a != 0 || n != 1 {
				t.Fatalf("%s went up by %v ambiguous, %v not_sent; want 0 and 1", railproxy.MetricForwards, a, n)
			}
			e := envelope(t, rec)
			if rec.Code != http.StatusServiceUnavailable || e.Code != api.CodeRailNotReached || !e.Retryable || rec.Header().Get("Retry-After") == "" {
				t.Fatalf("answer %d %s (Retry-After %q); want 503 %s, retryable, with Retry-After", rec.Code, rec.Body,
					rec.Header().Get("Retry-After"), api.CodeRailNotReached)
			}
			if strings.Contains(e.Message, "127.0.0.1") || strings.Contains(e.Message, railURL) {
				t.Fatalf("503 message %q carries internal text", e.Message)
			}
			if got := r.attemptStates(); !reflect.DeepEqual(got, map[api.State]int{api.StateNotSent: 1}) {
				t.Fatalf("attempt states %v, want one not_sent", got)
			}
			if got := r.logs.Events(t, api.EventSubmissionNotReached); len(got) != 1 || got[0]["released"] != true {
				t.Fatalf("rail_submission_not_reached lines %v; want one, released", got)
			}
			if n := len(r.stub.Submissions("")); n != 0 {
				t.Fatalf("rail records %d submissions, want 0", n)
			}
			q := p
			if tc.down {
				q = r.proxy(nil) // the rail is back
			}
			ans := mustAccept(t, q, "w", body("po-1", "acct-1", 2500), mustInt(t, tc.resends))
			if ans.Status != api.RailAck {
				t.Fatalf("resend answered %+v; want ACK", ans)
			}
			// Once forwarded, the payout is not forwarded again.
			rec = submit(q, "w", body("po-1", "acct-1", 2500), "44")
			if e := envelope(t, rec); rec.Code != http.StatusConflict || e.Code != api.CodeAlreadySubmitted {
				t.Fatalf("third submission: %d %s; want 409 %s", rec.Code, rec.Body, api.CodeAlreadySubmitted)
			}
			if got := r.stub.Submissions("po-1"); len(got) != 1 {
				t.Fatalf("rail records of po-1: %d, want exactly 1", len(got))
			}
		})
	}
}

// TestRailRefusalOfAStoppedReferenceIsDefinitive: the rail's 409
// REFERENCE_STOPPED (a reconciliation stopped the payout) is not
// ambiguous: nothing moved and nothing will; the attempt is not_at_rail
// and the answer 409 PAYOUT_STOPPED, not retryable.
func TestRailRefusalOfAStoppedReferenceIsDefinitive(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	if _, err := r.stub.Stop("po-1"); err != nil {
		t.Fatal(err)
	}
	rec := submit(p, "w", body("po-1", "acct-1", 2500), "42")
	if e := envelope(t, rec); rec.Code != http.StatusConflict || e.Code != api.CodePayoutStopped || e.Retryable {
		t.Fatalf("answer %d %s; want 409 %s, not retryable", rec.Code, rec.Body, api.CodePayoutStopped)
	}
	if got := r.attemptStates(); !reflect.DeepEqual(got, map[api.State]int{api.StateNotAtRail: 1}) {
		t.Fatalf("attempt states %v, want one not_at_rail", got)
	}
	if n := len(r.stub.Submissions("po-1")); n != 0 {
		t.Fatalf("rail records %d payments of po-1, want 0", n)
	}
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestDeclineIsAnsweredAndRecorded(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	ans := mustAccept(t, p, "w", body("po-big", "acct-1", railstub.DefaultDeclineOverMinor+1), 5)
	if ans.Status != api.RailDecline {
		t.Fatalf("answer %+v, want DECLINE", ans)
	}
	if got := r.attemptStates(); !reflect.DeepEqual(got, map[api.State]int{api.StateDeclined: 1}) {
		t.Fatalf("attempt states %v, want one declined", got)
	}
	if len(r.logs.Events(t, api.EventSubmissionDeclined)) != 1 {
		t.Fatal("no rail_submission_declined log line")
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	mustAccept(t, p, "w", body("po-1", "acct-1", 100), 42)

	good := map[string]any{"payoutId": "po-2", "accountId": "acct-1", "amountMinor": 100, "currency": "EUR",
		"termsSignature": fencingtest.Terms(fencewire.PayoutTerms{PayoutID: "po-2", AccountID: "acct-1", AmountMinor: 100, Currency: "EUR"})}
	with := func(k string, v any) string {
		m := map[string]any{}
		for kk, vv := range good {
			m[kk] = vv
		}
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
	ok := with("", nil)
	type req struct {
		method, path, ct, body string
		tokens                 []string
	}
	post := func(body string, tokens ...string) req {
		return req{"POST", api.PathSubmissions, "application/json", body, tokens}
	}
	// Every bad submission carries token 50, above the high-water: had any
	// of them passed the fence, the high-water would show it.
	for _, tc := range []struct {
		name   string
		req    req
		status int
		code   api.Code
	}{
		{"malformed JSON", post(`{"payoutId":`, "50"), 400, api.CodeInvalidRequest},
		{"empty body", post(``, "50"), 400, api.CodeInvalidRequest},
		{"two JSON objects", post(ok+ok, "50"), 400, api.CodeInvalidRequest},
		{"unknown field", post(with("token", 50), "50"), 400, api.CodeInvalidRequest},
		{"missing payoutId", post(with("payoutId", nil), "50"), 400, api.CodeInvalidRequest},
		{"missing accountId", post(with("accountId", nil), "50"), 400, api.CodeInvalidRequest},
		{"zero amount", post(with("amountMinor", 0), "50"), 400, api.CodeInvalidRequest},
		{"negative amount", post(with("amountMinor", -100), "50"), 400, api.CodeInvalidRequest},
		{"string amount", post(with("amountMinor", "100"), "50"), 400, api.CodeInvalidRequest},
		{"amount above the cap", post(with("amountMinor", 1_000_000_000_000_001), "50"), 400, api.CodeInvalidRequest},
		{"account id with a space", post(with("accountId", "acct 1"), "50"), 400, api.CodeInvalidRequest},
		{"account id with a NUL byte", post(with("accountId", "acct\x001"), "50"), 400, api.CodeInvalidRequest},
		{"payout id starting with a dot", post(with("payoutId", ".po-2"), "50"), 400, api.CodeInvalidRequest},
		{"lower-case currency", post(with("currency", "eur"), "50"), 400, api.CodeInvalidRequest},
		{"two-letter currency", post(with("currency", "EU"), "50"), 400, api.CodeInvalidRequest},
		{"unassigned currency", post(with("currency", "ZZZ"), "50"), 400, api.CodeInvalidRequest},
		{"testing currency", post(with("currency", "XTS"), "50"), 400, api.CodeInvalidRequest},
		{"oversized body", post(with("payoutId", strings.Repeat("p", api.MaxBodyBytes)), "50"), 413, api.CodeBodyTooLarge},
		// Terms payment-resource did not sign (terms_test.go has the
		// whole table): refused before the fence, with token 50 above it.
		{"no terms signature", post(with("termsSignature", nil), "50"), 403, api.CodeTermsUnsigned},
		{"amount other than the signed one", post(with("amountMinor", 101), "50"), 403, api.CodeInvalidTerms},
		{"payout id paydb does not know", post(with("payoutId", "po-ghost"), "50"), 403, api.CodeInvalidTerms},
		{"terms signature not a string", post(with("termsSignature", 7), "50"), 400, api.CodeInvalidRequest},
		{"missing token", post(ok), 400, api.CodeInvalidToken},
		{"empty token", post(ok, ""), 400, api.CodeInvalidToken},
		{"non-numeric token", post(ok, "fifty"), 400, api.CodeInvalidToken},
		{"zero token", post(ok, "0"), 400, api.CodeInvalidToken},
		{"negative token", post(ok, "-50"), 400, api.CodeInvalidToken},
		{"plus-signed token", post(ok, "+50"), 400, api.CodeInvalidToken},
		{"overflowing token", post(ok, "99999999999999999999"), 400, api.CodeInvalidToken},
		{"two token headers", post(ok, "50", "51"), 400, api.CodeInvalidToken},
		{"text content type", req{"POST", api.PathSubmissions, "text/plain", ok, []string{"50"}}, 415, api.CodeUnsupportedMediaType},
		{"GET submissions", req{"GET", api.PathSubmissions, "", "", []string{"50"}}, 405, api.CodeMethodNotAllowed},
		{"POST high-water", req{"POST", api.HighWaterPath("acct-1"), "application/json", ok, []string{"50"}}, 405, api.CodeMethodNotAllowed},
		{"high-water of a too long account", req{"GET", api.HighWaterPath(strings.Repeat("a", 65)), "", "", nil}, 400, api.CodeInvalidRequest},
		{"high-water of an unknown account", req{"GET", api.HighWaterPath("acct-none"), "", "", nil}, 404, api.CodeNotFound},
		{"attempts without payoutId", req{"GET", api.PathAttempts, "", "", nil}, 400, api.CodeInvalidRequest},
		{"attempts with two payoutIds", req{"GET", api.PathAttempts + "?payoutId=a&payoutId=b", "", "", nil}, 400, api.CodeInvalidRequest},
		{"attempts of a malformed payoutId", req{"GET", api.PathAttempts + "?payoutId=po%2F1", "", "", nil}, 400, api.CodeInvalidRequest},
		{"high-water of a malformed account", req{"GET", api.HighWaterPath("acct 1"), "", "", nil}, 400, api.CodeInvalidRequest},
		{"POST attempts", req{"POST", api.PathAttempts + "?payoutId=po-1", "application/json", ok, []string{"50"}}, 405, api.CodeMethodNotAllowed},
		{"unknown route", req{"POST", "/v1/rail/submit", "application/json", ok, []string{"50"}}, 404, api.CodeNotFound},
	} {
		hr := httptest.NewRequest(tc.req.method, tc.req.path, strings.NewReader(tc.req.body))
		if tc.req.ct != "" {
			hr.Header.Set("Content-Type", tc.req.ct)
		}
		for _, tok := range tc.req.tokens {
			hr.Header.Add(fencewire.HeaderToken, tok)
		}
		withProof(hr, tc.req.body, tc.req.tokens)
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, hr)
		if rec.Code != tc.status {
			t.Errorf("%s: status %d, body %s; want %d", tc.name, rec.Code, rec.Body, tc.status)
			continue
		}
		if e := envelope(t, rec); e.Code != tc.code || e.Retryable {
			t.Errorf("%s: envelope %+v; want %s, not retryable", tc.name, e, tc.code)
		}
	}
	if n := r.attemptRows(); n != 1 {
		t.Errorf("%d attempt rows, want 1: bad input was recorded", n)
	}
	if hw := highWater(t, p, "acct-1"); hw != 42 {
		t.Errorf("high-water %d, want 42: bad input moved the fence", hw)
	}
	if n := len(r.stub.Submissions("")); n != 1 {
		t.Errorf("rail received %d submissions, want 1: bad input reached the rail", n)
	}
	if n := len(r.logs.Events(t, fencewire.EventFencedOut)); n != 0 {
		t.Errorf("%d fenced_out lines, want 0", n)
	}
}

func TestConcurrentSubmissionsNeverLetALowerTokenThrough(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	const base, spread = 100, 40
	mustAccept(t, p, "w", body("po-base", "acct-1", 100), base)

	// A fixed seed: the interleaving comes from the scheduler; the seed only
	// shuffles the tokens, reproducibly.
	const seed = 20261129
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	var tokens []int64
	for i := int64(1); i <= spread; i++ {
		tokens = append(tokens, base-i, base+i)
	}
	rng.Shuffle(len(tokens), func(i, j int) { tokens[i], tokens[j] = tokens[j], tokens[i] })

	type outcome struct {
		token      int64
		status     int
		start, end time.Time
	}
	outcomes := make([]outcome, len(tokens))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, tok := range tokens {
		wg.Go(func() {
			<-start
			o := outcome{token: tok, start: time.Now()}
			rec := submit(p, fmt.Sprintf("w-%d", tok), body(fmt.Sprintf("po-%d", tok), "acct-1", 100), strconv.FormatInt(tok, 10))
			o.end, o.status = time.Now(), rec.Code
			outcomes[i] = o
		})
	}
	close(start)
	wg.Wait()

	accepted := map[int64]bool{base: true}
	for _, o := range outcomes {
		switch {
		case o.status != http.StatusOK && o.status != http.StatusConflict:
			t.Fatalf("token %d: status %d, want 200 or 409", o.token, o.status)
		case o.token < base && o.status != http.StatusConflict:
			t.Errorf("token %d passed after %d had been accepted", o.token, base)
		case o.status == http.StatusOK:
			accepted[o.token] = true
		}
	}
	if !accepted[base+spread] {
		t.Errorf("the highest token %d was refused", base+spread)
	}
	// Real time: a request sent after a higher token's acceptance was
	// answered must have been refused.
	for _, a := range outcomes {
		if a.status != http.StatusOK {
			continue
		}
		for _, b := range outcomes {
			if b.token < a.token && b.start.After(a.end) && b.status == http.StatusOK {
				t.Errorf("token %d passed although %d had been accepted before it was sent", b.token, a.token)
			}
		}
	}
	// Every refusal names a genuinely higher token that was accepted.
	for _, line := range r.logs.Events(t, fencewire.EventFencedOut) {
		pres, high := int64(line["presentedToken"].(float64)), int64(line["highestToken"].(float64))
		if high <= pres || !accepted[high] {
			t.Errorf("fenced_out presented %d highest %d: the highest must be an accepted token above it", pres, high)
		}
	}
	if hw := highWater(t, p, "acct-1"); hw != base+spread {
		t.Errorf("high-water %d, want %d", hw, base+spread)
	}
	if got, want := len(r.stub.Submissions("")), len(accepted); got != want {
		t.Errorf("rail received %d submissions, want %d (one per accepted token)", got, want)
	}
	states := r.attemptStates()
	if states[api.StateAcked] != len(accepted) || states[api.StateFenced] != len(tokens)+1-len(accepted) || len(states) != 2 {
		t.Errorf("attempt states %v; want %d acked and %d fenced", states, len(accepted), len(tokens)+1-len(accepted))
	}
}

func TestLoadConfig(t *testing.T) {
	env := map[string]string{
		api.EnvDatabaseURL:       "postgres://u@localhost:5432/raildb",
		api.EnvDatabaseInstance:  "proj:region:inst",
		api.EnvRailURL:           "http://127.0.0.1:9000/",
		api.EnvRailTimeoutMs:     "1500",
		api.EnvDBTimeoutMs:       "700",
		api.EnvFencingEnabled:    "false",
		api.EnvProofKeys:         fencingtest.LockSigningKey().VerifyKey().String(),
		api.EnvReceiptSigningKey: fencingtest.ReceiptSigningKey().String(),
		api.EnvTermsKeys:         fencingtest.TermsSigningKey().VerifyKey().String(),
	}
	getenv := func(k string) string { return env[k] }
	got, err := railproxy.LoadConfig(getenv)
	if err != nil {
		t.Fatal(err)
	}
	if got.DB.DSN != env[api.EnvDatabaseURL] || got.DB.CloudSQLInstance != "proj:region:inst" || got.RailURL != "http://127.0.0.1:9000/" ||
		got.RailTimeout != 1500*time.Millisecond || got.DBTimeout != 700*time.Millisecond || !got.FencingDisabled ||
		got.ProofKeys.Len() != 1 || got.ReceiptKey.ID() != fencingtest.ReceiptSigningKey().ID() || got.TermsKeys.Len() != 1 {
		t.Fatalf("LoadConfig = %+v", got)
	}
	delete(env, api.EnvFencingEnabled)
	delete(env, api.EnvRailTimeoutMs)
	if got, err := railproxy.LoadConfig(getenv); err != nil || got.FencingDisabled || got.RailTimeout != railproxy.DefaultRailTimeout {
		t.Fatalf("defaults: %+v, %v; want fencing on and a 5s rail timeout", got, err)
	}
	for k, v := range map[string]string{
		api.EnvDatabaseURL:    "",
		api.EnvRailURL:        "ftp://rail",
		api.EnvRailTimeoutMs:  "0",
		api.EnvDBTimeoutMs:    "soon",
		api.EnvFencingEnabled: "maybe",
		api.EnvProofKeys:      "k:short",
		// A public key where the secret goes (and none at all).
		api.EnvReceiptSigningKey: fencingtest.ReceiptSigningKey().VerifyKey().String(),
		// A secret key where the public ones go.
		api.EnvTermsKeys: fencingtest.TermsSigningKey().String(),
	} {
		bad := map[string]string{}
		for kk, vv := range env {
			bad[kk] = vv
		}
		bad[k] = v
		if _, err := railproxy.LoadConfig(func(k string) string { return bad[k] }); !errors.Is(err, railproxy.ErrInvalidConfig) {
			t.Errorf("%s=%q: error %v, want ErrInvalidConfig", k, v, err)
		}
	}
	for _, k := range []string{api.EnvProofKeys, api.EnvReceiptSigningKey, api.EnvTermsKeys} {
		missing := map[string]string{}
		for kk, vv := range env {
			missing[kk] = vv
		}
		delete(missing, k)
		_, err := railproxy.LoadConfig(func(k string) string { return missing[k] })
		if !errors.Is(err, railproxy.ErrInvalidConfig) || !strings.Contains(err.Error(), k) {
			t.Errorf("without %s (fencing on): %v; want ErrInvalidConfig naming it", k, err)
		}
		if secret := fencingtest.ReceiptSigningKey().String(); err != nil && strings.Contains(err.Error(), secret[len(secret)-20:]) {
			t.Errorf("LoadConfig error %q echoes a secret key", err)
		}
	}
	if _, err := railproxy.New(t.Context(), railproxy.Config{}, slog.New(slog.DiscardHandler)); !errors.Is(err, railproxy.ErrInvalidConfig) {
		t.Errorf("New(zero Config): %v, want ErrInvalidConfig", err)
	}
}

func TestControlBytesInIDsAreRefusedNot500(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	for _, target := range []string{"/v1/rail/high-water/%00x", "/v1/rail/attempts?payoutId=%00", "/v1/rail/attempts?payoutId=a%0Ab"} {
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, httptest.NewRequest("GET", target, nil))
		if rec.Code != http.StatusBadRequest {
			t.Errorf("GET %s: %d %s; want 400", target, rec.Code, rec.Body)
		}
	}
}

// mustBeDuplicate checks a 409 PAYOUT_ALREADY_SUBMITTED answer and returns
// the attempt it names.
func mustBeDuplicate(t *testing.T, rec *httptest.ResponseRecorder) api.AlreadySubmittedAnswer {
	t.Helper()
	var ans api.AlreadySubmittedAnswer
	if rec.Code != http.StatusConflict || json.Unmarshal(rec.Body.Bytes(), &ans) != nil || ans.Error.Code != api.CodeAlreadySubmitted {
		t.Fatalf("status %d, body %s; want 409 %s", rec.Code, rec.Body, api.CodeAlreadySubmitted)
	}
	return ans
}

// The stale holder's submission (token 1) overtakes the new holder's
// (token 3) on its way to rail-proxy. The fence lets it
// through, since nothing greater has been seen yet; the new holder's must
// not reach the rail a second time, and must learn what the first got.
func TestStaleSubmissionArrivingFirstIsTheOnlyOneToReachTheRail(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	first := mustAccept(t, p, "worker-a", body("po-1", "acct-1", 2500), 1)

	ans := mustBeDuplicate(t, submit(p, "worker-b", body("po-1", "acct-1", 2500), "3"))
	if a := ans.Attempt; a.AttemptID != first.AttemptID || a.Token != 1 || a.State != api.StateAcked || a.RailRef != first.RailRef || ans.Error.Retryable {
		t.Fatalf("refusal %+v; want attempt %d, token 1, acked with %s, not retryable", ans, first.AttemptID, first.RailRef)
	}
	if n := len(r.stub.Submissions("po-1")); n != 1 {
		t.Fatalf("rail received po-1 %d times, want 1", n)
	}
	// The new holder's token still raised the account's high-water: the
	// stale holder is fenced out of anything else on the account.
	if hw := highWater(t, p, "acct-1"); hw != 3 {
		t.Fatalf("high-water %d, want 3", hw)
	}
	mustBeFenced(t, submit(p, "worker-a", body("po-2", "acct-1", 100), "1"))
	if states := r.attemptStates(); states[api.StateAcked] != 1 || states[api.StateDuplicate] != 1 || states[api.StateFenced] != 1 {
		t.Fatalf("attempt states %v; want one acked, one duplicate, one fenced", states)
	}
}

// However the submissions of one payout interleave, with whatever tokens
// and through however many proxies, exactly one reaches the rail, and
// every other is told which one did.
func TestConcurrentSubmissionsOfOnePayoutReachTheRailOnce(t *testing.T) {
	r := newRig(t)
	proxies := []*railproxy.Proxy{r.proxy(nil), r.proxy(nil)}
	const n = 24
	codes := make([]int, n)
	refusals := make([]api.AlreadySubmittedAnswer, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			rec := submit(proxies[i%2], fmt.Sprintf("w-%d", i), body("po-1", "acct-1", 700), strconv.Itoa(100+i))
			codes[i] = rec.Code
			if rec.Code == http.StatusConflict {
				_ = json.Unmarshal(rec.Body.Bytes(), &refusals[i])
			}
		})
	}
	close(start)
	wg.Wait()
	ok := 0
	for i, c := range codes {
		switch {
		case c == http.StatusOK:
			ok++
		case c == http.StatusConflict && (refusals[i].Error.Code == api.CodeFencedOut || refusals[i].Error.Code == api.CodeAlreadySubmitted):
		default:
			t.Errorf("token %d: status %d %+v", 100+i, c, refusals[i])
		}
	}
	if got := len(r.stub.Submissions("po-1")); got != 1 || ok != 1 {
		t.Fatalf("rail received po-1 %d times, %d answers 200; want 1 and 1", got, ok)
	}
}

// A forwarded attempt whose proxy died before recording the rail's answer
// stays 'forwarding'. While a live proxy could still be calling the rail,
// a second submission is refused as retryable; after that, the attempt is
// marked ambiguous (for reconciliation) and the refusal is final.
func TestForwardingAttemptIsRetryableThenAbandoned(t *testing.T) {
	r := newRig(t)
	// Timeouts long enough for a loaded machine (a 100 ms DBTimeout met
	// 503s there); the attempt is aged past the threshold by hand.
	p := r.proxy(func(c *railproxy.Config) { c.RailTimeout, c.DBTimeout = time.Second, 2*time.Second })
	ctx := t.Context()
	var id int64
	if err := r.pool().QueryRow(ctx, `INSERT INTO rail_attempt (payout_id, account_id, token, amount_minor, currency, state)
VALUES ('po-1', 'acct-1', 5, 700, 'EUR', 'forwarding') RETURNING attempt_id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := r.pool().Exec(ctx, `INSERT INTO rail_payout (payout_id, attempt_id) VALUES ('po-1', $1)`, id); err != nil {
		t.Fatal(err)
	}
	ans := mustBeDuplicate(t, submit(p, "w", body("po-1", "acct-1", 700), "6"))
	if ans.Attempt.State != api.StateForwarding || !ans.Error.Retryable {
		t.Fatalf("refusal %+v; want the forwarding attempt, retryable", ans)
	}
	// Older than RailTimeout + 2 x DBTimeout + 1 s: no live proxy is calling.
	if _, err := r.pool().Exec(ctx, `UPDATE rail_attempt SET created_at = now() - interval '10 seconds' WHERE attempt_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	ans = mustBeDuplicate(t, submit(p, "w", body("po-1", "acct-1", 700), "7"))
	if ans.Attempt.State != api.StateAmbiguous || ans.Error.Retryable {
		t.Fatalf("refusal %+v; want the attempt marked ambiguous, not retryable", ans)
	}
	if len(r.logs.Events(t, api.EventAttemptAbandoned)) != 1 {
		t.Fatal("no rail_attempt_abandoned event")
	}
	if n := len(r.stub.Submissions("po-1")); n != 0 {
		t.Fatalf("rail received po-1 %d times, want 0", n)
	}
}

// TestLoadConfigReportsEveryInvalidVariable: one run of LoadConfig names
// every variable to fix (two that do not parse, one that parses but is
// invalid), not only the first.
func TestLoadConfigReportsEveryInvalidVariable(t *testing.T) {
	env := map[string]string{
		api.EnvDatabaseURL:    "postgres://u@localhost:5432/raildb",
		api.EnvRailURL:        "ftp://rail",
		api.EnvRailTimeoutMs:  "soon",
		api.EnvFencingEnabled: "maybe",
	}
	_, err := railproxy.LoadConfig(func(k string) string { return env[k] })
	if !errors.Is(err, railproxy.ErrInvalidConfig) {
		t.Fatalf("LoadConfig error = %v, want ErrInvalidConfig", err)
	}
	for _, name := range []string{api.EnvRailURL, api.EnvRailTimeoutMs, api.EnvFencingEnabled} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("LoadConfig error %q does not name %s", err, name)
		}
	}
}

// TestEnvNamesListsEveryVariableLoadConfigReads keeps the list the unknown
// variable warning uses equal to what LoadConfig reads.
func TestEnvNamesListsEveryVariableLoadConfigReads(t *testing.T) {
	read := map[string]bool{}
	_, _ = railproxy.LoadConfig(func(k string) string { read[k] = true; return "" })
	names := railproxy.EnvNames()
	for k := range read {
		if !slices.Contains(names, k) {
			t.Errorf("LoadConfig reads %s, EnvNames does not list it", k)
		}
	}
	if len(names) != len(read) {
		t.Errorf("EnvNames = %v, LoadConfig reads %v", names, read)
	}
}

// forwardsIn returns rail-proxy's count of forwards that ended in state
// (railproxy_forwards_total{state}).
func forwardsIn(t *testing.T, state api.State) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(railproxy.Collectors()...)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != railproxy.MetricForwards {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "state" && l.GetValue() == string(state) {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s series for state %q", railproxy.MetricForwards, state)
	return 0
}
