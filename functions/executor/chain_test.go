package executor_test

// The chain of one payout is short. The claim is
// preceded by a check of the lease's local deadline only (no round trip),
// the release follows the push's answer, and the acquire waits in
// lock-server's queue of the key.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor/fault"
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

// lockOp names a lock-server request by its operation: "acquire",
// "renew", "release", or "" for another.
func lockOp(r *http.Request) string {
	p := r.URL.Path
	if r.Method != http.MethodPost || !strings.HasPrefix(p, lockapi.PathLockPrefix) {
		return ""
	}
	for _, op := range []struct{ suffix, name string }{
		{lockapi.SuffixAcquire, "acquire"}, {lockapi.SuffixRenew, "renew"}, {lockapi.SuffixRelease, "release"},
	} {
		if strings.HasSuffix(p, op.suffix) {
			return op.name
		}
	}
	return ""
}

// chainRig is an Executor over a real lock-server (memstore) behind the
// test's middleware, and deps, as newExecutor builds one.
type chainRig struct {
	x       *executor.Executor
	store   *memstore.Store
	lockURL string
}

// rigConfig configures newChainRig.
type rigConfig struct {
	ttl, acquireWait time.Duration
	// requestTimeout is the Executor's RequestTimeout (0: the default).
	requestTimeout time.Duration
	// lock wraps lock-server's handler; lockLog is its logger (default:
	// discarded); opts are the Executor's options.
	lock    func(http.Handler) http.Handler
	lockLog *slog.Logger
	opts    []executor.Option
	// log is the Executor's logger (default: discarded).
	log *slog.Logger
}

func newChainRig(t *testing.T, deps *fakeDeps, rc rigConfig) chainRig {
	t.Helper()
	store := memstore.New(nil)
	if rc.lockLog == nil {
		rc.lockLog = slog.New(slog.DiscardHandler)
	}
	ls, err := lockserver.NewServer(store, lockserver.DefaultServerConfig(), rc.lockLog)
	if err != nil {
		t.Fatal(err)
	}
	lsrv := httptest.NewServer(rc.lock(ls))
	t.Cleanup(lsrv.Close)
	dsrv := httptest.NewServer(deps)
	t.Cleanup(dsrv.Close)
	cfg := executor.DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL = lsrv.URL, dsrv.URL, dsrv.URL
	cfg.Owner, cfg.LeaseTTL, cfg.AcquireWait = "worker-a", rc.ttl, rc.acquireWait
	cfg.ReportRetry = executor.RetryConfig{Attempts: 2, Initial: time.Millisecond, Max: 2 * time.Millisecond}
	if rc.requestTimeout > 0 {
		cfg.RequestTimeout = rc.requestTimeout
	}
	if rc.log == nil {
		rc.log = slog.New(slog.DiscardHandler)
	}
	x, err := executor.New(cfg, rc.log, append([]executor.Option{executor.WithRand(rand.New(rand.NewPCG(1, 2)))}, rc.opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	closeAtCleanup(t, x)
	return chainRig{x: x, store: store, lockURL: lsrv.URL}
}

// The chain of one payout, in the order its requests reach lock-server
// and the services: the acquire, the claim, the one
// confirmation (before the rail submission), the submission, the result,
// and the release. (Earlier versions also read the payout before the
// acquire, and confirmed between the acquire and the claim.) The TTL is long, so that no background renewal
// falls inside the chain.
func TestTheChainHasOneConfirmationBeforeTheSubmissionOnly(t *testing.T) {
	deps := &fakeDeps{railStatus: 200, railBody: `{"status":"ACK","railRef":"rail-000001"}`}
	record := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if op := lockOp(r); op != "" {
				deps.mu.Lock()
				deps.calls = append(deps.calls, "lock "+op)
				deps.mu.Unlock()
			}
			next.ServeHTTP(w, r)
		})
	}
	rig := newChainRig(t, deps, rigConfig{ttl: time.Minute, acquireWait: 3 * time.Second, lock: record})
	out, err := rig.x.Execute(t.Context(), event)
	if err != nil || out != executor.OutcomePosted {
		t.Fatalf("Execute = %q, %v; want posted", out, err)
	}
	if err := rig.x.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	deps.mu.Lock()
	defer deps.mu.Unlock()
	var got []string
	for _, c := range deps.calls {
		got = append(got, strings.Fields(c)[1])
	}
	want := []string{"acquire", api.ClaimPath("p-1"), "renew", railapi.PathSubmissions, api.ResultPath("p-1"), "release"}
	if !slices.Equal(got, want) {
		t.Fatalf("the chain of one payout: %v\nwant %v", deps.calls, want)
	}
}

// A lease whose local deadline passed between the grant and the claim
// (lock-server could not be reached to renew it) stops the worker before
// the claim, with no request: nothing is claimed, and the push is answered
// 503 LEASE_LOST (ErrNoLongerHolder) for redelivery, as a refused
// confirmation is.
func TestLeasePastItsLocalDeadlineStopsBeforeTheClaim(t *testing.T) {
	deps := &fakeDeps{railStatus: 200, railBody: `{"status":"ACK","railRef":"rail-000001"}`}
	// Every renewal fails (lock-server's backend is away), so the
	// background renewals cannot move the local deadline.
	noRenewals := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if lockOp(r) == "renew" {
				jsonhandler.WriteError(w, http.StatusServiceUnavailable, string(lockapi.CodeBackendUnavailable), "scripted", true)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// Between the grant and the claim, wait for the lease's local
	// deadline (Done closes when it passes).
	waitForDeadline := executor.WithFault(fault.Points{executor.AfterGrant: func(_ context.Context, _ executor.Delivery, l *client.Lease) {
		select {
		case <-l.Done():
		case <-ctx.Done():
			t.Error("the lease's local deadline never passed")
		}
	}})
	rig := newChainRig(t, deps, rigConfig{ttl: time.Duration(lockapi.MinTTLMs) * time.Millisecond, acquireWait: 3 * time.Second, lock: noRenewals,
		opts: []executor.Option{waitForDeadline}})
	body, _ := payoutevent.Encode(event, "m-1", "acct-7", 1)
	rec := push(t, rig.x, body)
	var env jsonhandler.Envelope
	if err := json.Unmarshal(rec.Body.Bytes(), &env); rec.Code != http.StatusServiceUnavailable || err != nil || env.Error.Code != "LEASE_LOST" {
		t.Fatalf("push answered %d %s; want 503 LEASE_LOST (redelivered)", rec.Code, rec.Body)
	}
	deps.mu.Lock()
	for _, c := range deps.calls {
		if strings.HasPrefix(c, "POST ") {
			t.Errorf("a write after the local deadline passed: %s", c)
		}
	}
	deps.mu.Unlock()
	out, err := rig.x.Execute(ctx, event) // the same through Execute
	if !errors.Is(err, executor.ErrNoLongerHolder) {
		t.Errorf("Execute = %q, %v; want ErrNoLongerHolder", out, err)
	}
}

// The push is answered before the lease's release reaches lock-server:
// with the release held at lock-server, the answer arrives all the same.
// A graceful stop (Close) waits for that release: with a context that
// ends first it says the release is still in flight; once lock-server
// answers, Close returns and the lock is free. After Close, an execution
// releases before it answers.
func TestPushIsAnsweredBeforeTheReleaseAndCloseWaitsForIt(t *testing.T) {
	deps := &fakeDeps{railStatus: 200, railBody: `{"status":"ACK","railRef":"rail-000001"}`}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	var (
		arrivedOnce sync.Once
		arrived     = make(chan struct{}) // a release reached lock-server
		letGo       = make(chan struct{}) // lock-server may handle it
	)
	holdRelease := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if lockOp(r) == "release" {
				arrivedOnce.Do(func() { close(arrived) })
				select {
				case <-letGo:
				case <-ctx.Done():
				}
			}
			next.ServeHTTP(w, r)
		})
	}
	// The release's own timeout (RequestTimeout) is longer than the test:
	// only lock-server's answer ends it.
	var logs logtest.Buffer
	rig := newChainRig(t, deps, rigConfig{ttl: time.Minute, acquireWait: 3 * time.Second, requestTimeout: time.Minute, lock: holdRelease,
		log: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}) // lease_released is DEBUG
	body, _ := payoutevent.Encode(event, "m-1", "acct-7", 1)
	answered := make(chan *httptest.ResponseRecorder, 1)
	go func() { answered <- push(t, rig.x, body) }()
	select {
	case rec := <-answered:
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"posted"`) {
			t.Fatalf("push answered %d %s; want 200 posted", rec.Code, rec.Body)
		}
		if n := len(logs.Events(t, executor.EventLeaseReleased)) + len(logs.Events(t, executor.EventLeaseReleaseFailed)); n != 0 {
			close(letGo)
			t.Fatalf("the release ended (%d lines) before the push was answered, while lock-server held it: the answer waited for the release", n)
		}
	case <-ctx.Done():
		close(letGo)
		t.Fatal("the push was not answered while its lease's release was held at lock-server: the answer waits for the release")
	}
	select {
	case <-arrived:
	case <-ctx.Done():
		t.Fatal("the lease was never released")
	}
	if st, _ := rig.store.Inspect(ctx, event.LockKey()); st.Lease == nil {
		t.Fatal("the lease ended although its release is held before lock-server")
	}
	over, stop := context.WithCancel(ctx)
	stop()
	if err := rig.x.Close(over); !errors.Is(err, context.Canceled) {
		close(letGo)
		t.Fatalf("Close with a release in flight and a context that has ended = %v; want context.Canceled (the release still in flight)", err)
	}
	close(letGo)
	if err := rig.x.Close(ctx); err != nil {
		t.Fatalf("Close = %v once lock-server may answer the release; want nil", err)
	}
	if st, _ := rig.store.Inspect(ctx, event.LockKey()); st.Lease != nil {
		t.Fatalf("Close returned with the lease still held (%+v): it did not wait for the release", st.Lease)
	}
	// After Close, the release goes before the answer.
	if rec := push(t, rig.x, body); rec.Code != http.StatusOK {
		t.Fatalf("push after Close answered %d %s; want 200", rec.Code, rec.Body)
	}
	if st, _ := rig.store.Inspect(ctx, event.LockKey()); st.Lease != nil {
		t.Fatalf("after Close, a push answered with its lease still held (%+v)", st.Lease)
	}
}

// The executor's acquire waits in lock-server's queue of the key
// (waitMs) instead of retrying with backoff, for AcquireWait in whole
// milliseconds up to lock-server's MaxWaitMs (an AcquireWait below
// MinWaitMs sends no wait: TestQueueWaitBounds).
func TestAcquireWaitsInLockServersQueue(t *testing.T) {
	for _, c := range []struct {
		acquireWait time.Duration
		wantWaitMs  int64
	}{
		{3 * time.Second, 3000},
		{1500*time.Millisecond + 700*time.Microsecond, 1500},
		{2 * time.Minute, lockapi.MaxWaitMs},
	} {
		deps := &fakeDeps{railStatus: 200, railBody: `{"status":"ACK","railRef":"rail-000001"}`}
		var (
			mu    sync.Mutex
			waits []int64
		)
		record := func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if lockOp(r) == "acquire" {
					var req lockapi.AcquireRequest
					r.Body = readBack(t, r, &req)
					mu.Lock()
					waits = append(waits, req.WaitMs)
					mu.Unlock()
				}
				next.ServeHTTP(w, r)
			})
		}
		rig := newChainRig(t, deps, rigConfig{ttl: time.Minute, acquireWait: c.acquireWait, lock: record})
		if out, err := rig.x.Execute(t.Context(), event); err != nil || out != executor.OutcomePosted {
			t.Fatalf("AcquireWait %v: Execute = %q, %v; want posted", c.acquireWait, out, err)
		}
		mu.Lock()
		if len(waits) != 1 || waits[0] != c.wantWaitMs {
			t.Errorf("AcquireWait %v: acquire requests with waitMs %v; want one with %d", c.acquireWait, waits, c.wantWaitMs)
		}
		mu.Unlock()
	}
}

// The acquire of the account's next delivery, arriving while another
// worker still holds the lock, is granted right after that release: it
// waits in lock-server's queue (acquire_queued) instead of being refused
// LOCK_HELD and retried after the SDK's backoff.
func TestNextDeliveryIsGrantedFromTheQueueAfterTheRelease(t *testing.T) {
	deps := &fakeDeps{railStatus: 200, railBody: `{"status":"ACK","railRef":"rail-000001"}`}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	refused := make(chan int, 8)
	record := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if lockOp(r) != "acquire" {
				next.ServeHTTP(w, r)
				return
			}
			c := &statusCapture{ResponseWriter: w}
			next.ServeHTTP(c, r)
			if c.status == http.StatusConflict {
				refused <- c.status
			}
		})
	}
	queued := &eventSignal{name: lockserver.EventAcquireQueued, ch: make(chan struct{})}
	rig := newChainRig(t, deps, rigConfig{ttl: time.Minute, acquireWait: 20 * time.Second, lock: record, lockLog: slog.New(queued)})
	held, err := rig.store.Acquire(ctx, event.LockKey(), "worker-b", time.Minute) // another worker's lease
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		out, err := rig.x.Execute(ctx, event)
		if err == nil && out != executor.OutcomePosted {
			err = errors.New("outcome " + string(out))
		}
		done <- err
	}()
	select {
	case <-queued.ch:
	case <-refused:
		t.Fatal("the acquire was refused LOCK_HELD while another worker held the lock; want it queued at lock-server")
	case <-ctx.Done():
		t.Fatal("the acquire never joined lock-server's queue")
	}
	other, err := client.New(rig.lockURL)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.ReleaseLease(ctx, event.LockKey(), "worker-b", held.Token); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Execute after the other worker's release: %v; want posted", err)
	}
	select {
	case <-refused:
		t.Fatal("an acquire was refused LOCK_HELD; want the queued one granted")
	default:
	}
}

// statusCapture records the status a handler answers with.
type statusCapture struct {
	http.ResponseWriter
	status int
}

func (c *statusCapture) WriteHeader(code int) {
	c.status = code
	c.ResponseWriter.WriteHeader(code)
}

// eventSignal is a slog.Handler, at every level, that closes ch at the
// first record whose "event" attribute is name.
type eventSignal struct {
	name string
	ch   chan struct{}
	once sync.Once
}

func (h *eventSignal) Enabled(context.Context, slog.Level) bool { return true }

func (h *eventSignal) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "event" && a.Value.String() == h.name {
			h.once.Do(func() { close(h.ch) })
			return false
		}
		return true
	})
	return nil
}

func (h *eventSignal) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *eventSignal) WithGroup(string) slog.Handler      { return h }

// readBack decodes r's JSON body into v and returns a body that reads
// the same bytes again, for the handler behind.
func readBack(t *testing.T, r *http.Request, v any) io.ReadCloser {
	t.Helper()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Error(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Errorf("body %s: %v", b, err)
	}
	return io.NopCloser(bytes.NewReader(b))
}
