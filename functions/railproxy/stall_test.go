package railproxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/fuzztest"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/overload"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/overload/overloadtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// callerTimeout is the executor's RequestTimeout (5 s by default): a 503
// that arrives later is, to the executor, no answer.
const callerTimeout = 5 * time.Second

// waitLimit bounds every wait for an asynchronous condition here.
const waitLimit = 20 * time.Second

// submissionWave sends n submissions at once through caller, each of its
// own payout (tag-i) on one of ten accounts, token 10, with lock-server's
// proof, and returns every answer.
func submissionWave(caller *http.Client, base, tag string, n int) []overloadtest.Answer[api.Code] {
	return overloadtest.Wave[api.Code](caller, n, func(i int) *http.Request {
		b := body(fmt.Sprintf("%s-%d", tag, i), fmt.Sprintf("acct-%d", i%10), 100)
		req, _ := http.NewRequest(http.MethodPost, base+api.PathSubmissions, strings.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(fencewire.HeaderToken, "10")
		req.Header.Set(fencewire.HeaderOwner, "worker-"+strconv.Itoa(i))
		req.Header.Set(fencewire.HeaderProof, fencingtest.Proof(fmt.Sprintf("acct-%d", i%10), 10))
		return req
	})
}

// shedLines counts the requests refused by the breaker or the bound
// without a raildb transaction.
func shedLines(t *testing.T, r *rig) int {
	n := 0
	for _, m := range r.logs.Events(t, api.EventRequestFailed) {
		if m["msg"] == "rail-proxy request shed" {
			n++
		}
	}
	return n
}

// With raildb frozen (postmaster and backends
// SIGSTOPped), every submission waited the whole 5 s DBTimeout, as long
// as the executor's own timeout, without Retry-After. Now the first wave
// is answered 503 with Retry-After before the executor gives up (raildb
// is marked stalled once it has answered nothing for StallAfter, and the
// fence transactions still waiting are cut), the next wave is refused by
// the breaker without a transaction, nothing is recorded in raildb and
// nothing reaches the rail, goroutines come back, and after the thaw the
// first probe finds raildb and submissions pass again.
func TestFrozenRaildbIsAnswered503WithRetryAfterAndRecovers(t *testing.T) {
	const (
		concurrent  = 200
		maxInFlight = 64
	)
	cluster := pgtest.NewCluster(t)
	if err := cluster.CreateDatabase(t.Context(), "raildb"); err != nil {
		t.Fatal(err)
	}
	r := newRig(t)
	r.dsn = cluster.DSN("raildb")
	clock := overloadtest.NewClock(time.Unix(1_790_000_000, 0))
	p := r.proxy(func(c *railproxy.Config) {
		c.MaxInFlight, c.Now, c.StallAfter = maxInFlight, clock.Now, overload.DefaultStallAfter
	})
	t.Cleanup(func() { _ = cluster.Thaw() }) // before the proxy's Close
	reg := prometheus.NewRegistry()
	reg.MustRegister(railproxy.Collectors()...)
	mustAccept(t, p, "worker-0", body("seed", "acct-0", 100), 5)
	db, err := pgxpool.New(t.Context(), r.dsn)
	if err != nil {
		t.Fatal(err)
	}
	before, err := fuzztest.Snapshot(t.Context(), db)
	db.Close() // not left open on the frozen server
	if err != nil {
		t.Fatal(err)
	}
	atRail := len(r.stub.Submissions(""))

	timed := &overloadtest.TimedHandler{Next: p}
	srv := httptest.NewServer(timed)
	defer srv.Close()
	// The caller's own timeout is generous: under -race on a loaded
	// machine, 200 new connections at once take seconds to be accepted.
	// What must beat the executor's timeout is the service's answer,
	// measured from the moment its handler has the request (timed).
	caller := &http.Client{Timeout: time.Minute}
	defer caller.CloseIdleConnections()
	goroutines := runtime.NumGoroutine()
	if err := cluster.Freeze(); err != nil {
		t.Fatal(err)
	}

	stopPeak := overloadtest.Peak(t, reg, "railproxy_requests_in_flight")
	first := submissionWave(caller, srv.URL, "w1", concurrent)
	peak := stopPeak()
	t.Logf("wave 1 latency at the caller: %s", overloadtest.Spread(first))
	if slowest := timed.Reset(); slowest >= callerTimeout {
		t.Fatalf("wave 1: the slowest answer took %v in the handler; want it before the executor's %v", slowest, callerTimeout)
	} else {
		t.Logf("wave 1: slowest answer in the handler %v", slowest.Round(time.Millisecond))
	}
	counts := map[api.Code]int{}
	for i, a := range first {
		switch {
		case a.Err != nil:
			t.Fatalf("wave 1, request %d: no answer: %v", i, a.Err)
		case a.Status != http.StatusServiceUnavailable || a.RetryAfter != "1" || (a.Code != api.CodeUnavailable && a.Code != api.CodeOverloaded):
			t.Fatalf("wave 1, request %d: %d %s Retry-After %q; want 503 UNAVAILABLE or OVERLOADED with Retry-After 1", i, a.Status, a.Code, a.RetryAfter)
		}
		counts[a.Code]++
	}
	t.Logf("wave 1: %v, in-flight peak %d", counts, peak)
	if pk := peak; pk > maxInFlight || pk < 1 {
		t.Fatalf("in-flight gauge peaked at %d; want 1..%d (the bound)", pk, maxInFlight)
	}
	if overloadtest.Gauge(t, reg, "railproxy_db_stalled") != 1 || len(r.logs.Events(t, "backend_stalled")) != 1 {
		t.Fatal("raildb is not marked stalled, once, after it answered nothing")
	}

	shedBefore := shedLines(t, r)
	second := submissionWave(caller, srv.URL, "w2", concurrent)
	t.Logf("wave 2 latency at the caller: %s; slowest in the handler %v", overloadtest.Spread(second), timed.Reset().Round(time.Millisecond))
	for i, a := range second {
		if a.Err != nil || a.Status != http.StatusServiceUnavailable || a.Code != api.CodeUnavailable || a.RetryAfter != "1" {
			t.Fatalf("wave 2, request %d: %d %s Retry-After %q err %v; want 503 UNAVAILABLE with Retry-After 1", i, a.Status, a.Code, a.RetryAfter, a.Err)
		}
	}
	if n := shedLines(t, r) - shedBefore; n != concurrent {
		t.Fatalf("wave 2: %d of %d submissions refused by the breaker; the others went to raildb", n, concurrent)
	}
	caller.CloseIdleConnections()
	overloadtest.AwaitGoroutines(t, goroutines+8, waitLimit)

	if err := cluster.Thaw(); err != nil {
		t.Fatal(err)
	}
	awaitRaildbFound(t, p, clock, "acct-0")
	if overloadtest.Gauge(t, reg, "railproxy_db_stalled") != 0 || len(r.logs.Events(t, "backend_recovered")) != 1 {
		t.Fatal("recovered, but the gauge or the log does not say so")
	}
	after, err := fuzztest.Snapshot(t.Context(), r.pool())
	if err != nil {
		t.Fatal(err)
	}
	if changed := before.Changed(after); len(changed) > 0 {
		t.Fatalf("the stall changed raildb: %v", changed)
	}
	if n := len(r.stub.Submissions("")); n != atRail {
		t.Fatalf("the rail received %d submissions during the stall", n-atRail)
	}
	mustAccept(t, p, "worker-1", body("w1-1", "acct-1", 100), 10) // refused during the stall, passes now
}

// The in-flight bound: with RAIL_PROXY_MAX_IN_FLIGHT submissions held
// (one waiting for the account's high-water row, which the test locks),
// one more request is answered 503 OVERLOADED with Retry-After at once;
// nothing is recorded for it, and the held one goes on once the lock is
// released.
func TestRequestsBeyondMaxInFlightAreShedAtOnce(t *testing.T) {
	r := newRig(t)
	p := r.proxy(func(c *railproxy.Config) { c.MaxInFlight, c.StallAfter = 1, 0 })
	reg := prometheus.NewRegistry()
	reg.MustRegister(railproxy.Collectors()...)
	mustAccept(t, p, "worker-0", body("p-0", "acct-7", 100), 5)
	tx, err := r.pool().Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(t.Context(), "SELECT 1 FROM rail_high_water WHERE account_id = 'acct-7' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	held := make(chan int, 1)
	go func() { held <- submit(p, "worker-1", body("p-1", "acct-7", 100), "6").Code }()
	deadline := time.Now().Add(waitLimit)
	for overloadtest.Gauge(t, reg, "railproxy_requests_in_flight") < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the submission never got in flight")
		}
		runtime.Gosched()
	}
	attempts := r.attemptRows()
	rec := submit(p, "worker-2", body("p-2", "acct-8", 100), "6")
	if e := envelope(t, rec); rec.Code != http.StatusServiceUnavailable || e.Code != api.CodeOverloaded || !e.Retryable || rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("the request beyond the bound: %d %s Retry-After %q; want 503 OVERLOADED, retryable, Retry-After 1", rec.Code, rec.Body, rec.Header().Get("Retry-After"))
	}
	if r.attemptRows() != attempts || len(r.stub.Submissions("p-2")) != 0 {
		t.Fatal("the shed submission was recorded or reached the rail")
	}
	if err := tx.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st := <-held; st != http.StatusOK {
		t.Fatalf("the held submission ended %d", st)
	}
	mustAccept(t, p, "worker-2", body("p-2", "acct-8", 100), 6)
}

// awaitRaildbFound moves clock on by a probe interval at a time until a
// probe finds the thawed raildb and account's high-water mark is answered
// 200 again; anything but 503 before that, or waitLimit passing, fails the
// test.
func awaitRaildbFound(t *testing.T, p http.Handler, clock *overloadtest.Clock, account string) {
	t.Helper()
	clock.Add(railproxy.DefaultConfig().StallProbeInterval)
	deadline := time.Now().Add(waitLimit)
	for {
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, httptest.NewRequest("GET", api.HighWaterPath(account), nil))
		if rec.Code == http.StatusOK {
			break
		}
		if rec.Code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("after the thaw: %d %s; want 200 once a probe finds raildb (within %v)", rec.Code, rec.Body, waitLimit)
		}
		clock.Add(railproxy.DefaultConfig().StallProbeInterval)
	}
}

// TestACallerThatGoesAwayIsNotARaildbFailure: a read whose caller went
// away (cancelled, or closed its connection) before raildb answered is
// answered 499 REQUEST_CANCELLED and logged as a refusal, not as an
// ERROR 503 UNAVAILABLE, which the payout API's availability SLO counts
// against raildb (payment-resource and lock-server do the same). The same
// read with its caller still there is served.
func TestACallerThatGoesAwayIsNotARaildbFailure(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	if rec := submit(p, "w", body("po-1", "acct-1", 100), "7"); rec.Code != http.StatusOK {
		t.Fatalf("submission: %d %s", rec.Code, rec.Body)
	}
	for _, path := range []string{api.HighWaterPath("acct-1"), api.AttemptsPath("po-1")} {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		w := httptest.NewRecorder()
		p.ServeHTTP(w, httptest.NewRequestWithContext(ctx, http.MethodGet, path, nil))
		var env api.ErrorEnvelope
		if err := json.Unmarshal(w.Body.Bytes(), &env); err != nil || w.Code != api.StatusRequestCancelled || env.Error.Code != api.CodeRequestCancelled || env.Error.Retryable {
			t.Fatalf("GET %s by a caller that went away: %d %s; want %d %s, not retryable", path, w.Code, w.Body, api.StatusRequestCancelled, api.CodeRequestCancelled)
		}
		w = httptest.NewRecorder()
		p.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		if w.Code != http.StatusOK {
			t.Fatalf("GET %s with its caller there: %d %s", path, w.Code, w.Body)
		}
	}
	if lines := r.logs.Events(t, api.EventRequestFailed); len(lines) != 0 {
		t.Fatalf("logged %d rail_request_failed line(s) for callers that went away: %v", len(lines), lines)
	}
	n := 0
	for _, m := range r.logs.Events(t, api.EventRequestRefused) {
		if m["code"] == string(api.CodeRequestCancelled) {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("%d rail_request_refused line(s) with code %s; want 2", n, api.CodeRequestCancelled)
	}
}
