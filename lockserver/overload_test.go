package lockserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// gateStore is a memstore whose Acquire, while held, waits for the gate
// (or its context, then answering like a real store that timed out).
type gateStore struct {
	store.LockStore
	held    atomic.Bool
	gate    chan struct{}
	entered chan time.Duration // each held Acquire sends the time its ctx had left
	calls   atomic.Int64
}

func newGateStore() *gateStore {
	return &gateStore{LockStore: memstore.New(nil), gate: make(chan struct{}), entered: make(chan time.Duration, 64)}
}

func (g *gateStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (store.Lease, error) {
	if err := g.hold(ctx); err != nil {
		return store.Lease{}, err
	}
	return g.LockStore.Acquire(ctx, key, owner, ttl)
}

// hold counts a call and, while the gate is held, reports the call's
// time left to entered and waits for the gate to open or ctx to end
// (then an error wrapping store.ErrUnavailable).
func (g *gateStore) hold(ctx context.Context) error {
	g.calls.Add(1)
	if !g.held.Load() {
		return nil
	}
	left := time.Duration(-1)
	if dl, ok := ctx.Deadline(); ok {
		left = time.Until(dl)
	}
	g.entered <- left
	select {
	case <-g.gate:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", store.ErrUnavailable, ctx.Err())
	}
}

type fakeNow struct {
	mu sync.Mutex
	t  time.Time
}

func (f *fakeNow) now() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.t }
func (f *fakeNow) add(d time.Duration) {
	f.mu.Lock()
	f.t = f.t.Add(d)
	f.mu.Unlock()
}

func acquireReq(h http.Handler, key string, headers ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("POST", api.PathLockPrefix+key+api.SuffixAcquire, strings.NewReader(`{"owner":"w","ttlMs":60000}`))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func wantRefused(t *testing.T, what string, rec *httptest.ResponseRecorder, code api.Code) {
	t.Helper()
	var env api.ErrorEnvelope
	if rec.Code != http.StatusServiceUnavailable || json.Unmarshal(rec.Body.Bytes(), &env) != nil || env.Error.Code != code || !env.Error.Retryable {
		t.Fatalf("%s: %d %s; want 503 %s, retryable", what, rec.Code, rec.Body, code)
	}
	if ra := rec.Header().Get("Retry-After"); ra != "1" {
		t.Fatalf("%s: Retry-After %q; want 1", what, ra)
	}
}

// newStalledServer returns a lock-server (backend deadline 100 ms, a probe
// a minute, on clock) over a gate store that holds every call, after its
// first request met the frozen backend and marked it stalled.
func newStalledServer(t *testing.T) (http.Handler, *gateStore, *fakeNow) {
	t.Helper()
	store := newGateStore()
	clock := &fakeNow{t: time.Unix(1_790_000_000, 0)}
	cfg := lockserver.DefaultServerConfig()
	cfg.RequestTimeout, cfg.StallProbeInterval, cfg.Now = 100*time.Millisecond, time.Minute, clock.now
	h := serverWith(t, store, cfg)
	store.held.Store(true)
	wantRefused(t, "the request that meets the frozen backend", acquireReq(h, "k1"), api.CodeBackendUnavailable)
	<-store.entered
	return h, store, clock
}

// With the backend frozen every request waited the
// whole backend deadline. Now the first timeout marks the backend stalled,
// later requests get 503 with Retry-After without calling the backend, one
// probe per interval is let through, and the first answer clears the mark.
func TestAStalledBackendGetsFast503sAndRecovers(t *testing.T) {
	h, store, clock := newStalledServer(t)
	for i := range 5 {
		wantRefused(t, fmt.Sprintf("request %d while stalled", i), acquireReq(h, "k1"), api.CodeBackendUnavailable)
	}
	if n := store.calls.Load(); n != 1 {
		t.Fatalf("the backend was called %d times while stalled; want only the first request", n)
	}
	// The backend returns; the next probe finds it and clears the mark.
	store.held.Store(false)
	wantRefused(t, "before the probe interval", acquireReq(h, "k1"), api.CodeBackendUnavailable)
	clock.add(time.Minute)
	if rec := acquireReq(h, "k1"); rec.Code != http.StatusOK {
		t.Fatalf("the probe: %d %s; want the grant", rec.Code, rec.Body)
	}
	if rec := acquireReq(h, "k2"); rec.Code != http.StatusOK {
		t.Fatalf("after recovery: %d %s", rec.Code, rec.Body)
	}
	if n := store.calls.Load(); n != 3 {
		t.Fatalf("backend calls %d; want 3 (the stall, the probe, one after)", n)
	}
}

// The in-flight bound: one request more than MaxInFlight is refused at once
// with OVERLOADED, liveness still answers, and the server serves again as
// soon as slots free.
func TestRequestsBeyondMaxInFlightAreRefusedAtOnce(t *testing.T) {
	store := newGateStore()
	cfg := lockserver.DefaultServerConfig()
	cfg.RequestTimeout, cfg.MaxInFlight = time.Minute, 2
	h := serverWith(t, store, cfg)
	store.held.Store(true)
	var wg sync.WaitGroup
	codes := make(chan int, 2)
	for i := range 2 {
		wg.Go(func() { codes <- acquireReq(h, fmt.Sprintf("busy-%d", i)).Code })
	}
	<-store.entered
	<-store.entered
	wantRefused(t, "the third request", acquireReq(h, "k3"), api.CodeOverloaded)
	if n := store.calls.Load(); n != 2 {
		t.Fatalf("backend calls %d; want 2: the refused request must not reach it", n)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", api.PathHealth, nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("liveness while full: %d", rec.Code)
	}
	store.held.Store(false)
	close(store.gate)
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK {
			t.Fatalf("a held request ended %d", c)
		}
	}
	if rec := acquireReq(h, "k3"); rec.Code != http.StatusOK {
		t.Fatalf("after the slots freed: %d %s", rec.Code, rec.Body)
	}
}

// One budget: a caller that will wait 300 ms gives the backend at most
// 200 ms (DeadlineMargin kept for the answer), and a timeout inside the
// caller's shorter budget does not mark the backend stalled.
func TestTheCallersBudgetBoundsTheBackendDeadline(t *testing.T) {
	store := newGateStore()
	cfg := lockserver.DefaultServerConfig()
	cfg.RequestTimeout = time.Minute
	h := serverWith(t, store, cfg)
	store.held.Store(true)
	wantRefused(t, "a caller with 300 ms", acquireReq(h, "k", api.HeaderTimeoutMs, "300"), api.CodeBackendUnavailable)
	if left := <-store.entered; left <= 0 || left > 300*time.Millisecond-lockserver.DeadlineMargin {
		t.Fatalf("the backend had %v; want at most %v", left, 300*time.Millisecond-lockserver.DeadlineMargin)
	}
	store.held.Store(false)
	if rec := acquireReq(h, "k"); rec.Code != http.StatusOK {
		t.Fatalf("after a caller's own short budget ran out, the backend was treated as stalled: %d %s", rec.Code, rec.Body)
	}
	close(store.gate)
}

// A malformed budget is refused 400 INVALID_REQUEST before anything is
// done (the newcomer's probe 14 sent -1 and a 20-digit value, and both were
// silently ignored); the bounds are api.MaxRequestTimeoutMs.
func TestAMalformedBudgetIsRefused(t *testing.T) {
	store := newGateStore()
	h := serverWith(t, store, lockserver.DefaultServerConfig())
	for _, v := range []string{"-1", "99999999999999999999", "abc", "0", "+5", "05", "1e3", " 5", "5 ", "",
		fmt.Sprint(api.MaxRequestTimeoutMs + 1)} {
		rec := acquireReq(h, "k", api.HeaderTimeoutMs, v)
		var env api.ErrorEnvelope
		if rec.Code != http.StatusBadRequest || json.Unmarshal(rec.Body.Bytes(), &env) != nil || env.Error.Code != api.CodeInvalidRequest {
			t.Errorf("%s %q: %d %s; want 400 %s", api.HeaderTimeoutMs, v, rec.Code, rec.Body, api.CodeInvalidRequest)
		}
	}
	req := httptest.NewRequest("GET", api.PathLockPrefix+"k", nil)
	req.Header.Add(api.HeaderTimeoutMs, "500")
	req.Header.Add(api.HeaderTimeoutMs, "600")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusBadRequest {
		t.Errorf("%s sent twice: %d %s; want 400", api.HeaderTimeoutMs, rec.Code, rec.Body)
	}
	if n := store.calls.Load(); n != 0 {
		t.Errorf("refused requests reached the store %d times", n)
	}
	for _, v := range []string{fmt.Sprint(api.MinRequestTimeoutMs), "500", fmt.Sprint(api.MaxRequestTimeoutMs)} {
		if rec := acquireReq(h, "ok-"+v, api.HeaderTimeoutMs, v); rec.Code != http.StatusOK {
			t.Errorf("%s %q: %d %s; want 200", api.HeaderTimeoutMs, v, rec.Code, rec.Body)
		}
	}
}

// pingStore is a memstore whose Ping waits for its context and reports
// the time that context had left.
type pingStore struct {
	store.LockStore
	left chan time.Duration
}

func (p *pingStore) Ping(ctx context.Context) error {
	left := time.Duration(-1)
	if dl, ok := ctx.Deadline(); ok {
		left = time.Until(dl)
	}
	p.left <- left
	<-ctx.Done()
	return fmt.Errorf("%w: %w", store.ErrUnavailable, ctx.Err())
}

// /readyz has its own short bound: with a backend that does not answer,
// the probe gets 503 BACKEND_UNAVAILABLE after ReadyTimeout (1 s by
// default), not after RequestTimeout (5 s, what the newcomer's probe 14
// measured), and that does not mark the backend stalled.
func TestReadinessHasItsOwnShortBound(t *testing.T) {
	store := &pingStore{LockStore: memstore.New(nil), left: make(chan time.Duration, 4)}
	cfg := lockserver.DefaultServerConfig()
	if cfg.ReadyTimeout != time.Second {
		t.Fatalf("default ReadyTimeout %v, want 1s", cfg.ReadyTimeout)
	}
	h := serverWith(t, store, cfg)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", api.PathReady, nil))
	if left := <-store.left; left <= 0 || left > cfg.ReadyTimeout {
		t.Errorf("the readiness ping had %v; want at most ReadyTimeout %v", left, cfg.ReadyTimeout)
	}
	wantRefused(t, "readyz with a silent backend", rec, api.CodeBackendUnavailable)
	if rec := acquireReq(h, "k"); rec.Code != http.StatusOK {
		t.Fatalf("a readiness timeout marked the backend stalled: %d %s", rec.Code, rec.Body)
	}
	bad := cfg
	bad.ReadyTimeout = 0
	if err := bad.Validate(); err == nil {
		t.Errorf("ReadyTimeout 0 validated")
	}
}

// A budget too short for the backend call is refused 400 INVALID_REQUEST
// before anything is done. The newcomer's probe sent 1..101 ms: the
// backend got 1 ms, the answer was 503 and the grant was often written all
// the same (measured on pgstore: 9 to 62% of the 503s of budgets 1..150 ms
// left a lease standing, held by a caller told 503).
func TestABudgetTooShortForTheBackendIsRefused(t *testing.T) {
	store := newGateStore()
	h := serverWith(t, store, lockserver.DefaultServerConfig())
	for _, v := range []string{"1", "50", "101", "150", fmt.Sprint(api.MinRequestTimeoutMs - 1)} {
		rec := acquireReq(h, "short-"+v, api.HeaderTimeoutMs, v)
		var env api.ErrorEnvelope
		if rec.Code != http.StatusBadRequest || json.Unmarshal(rec.Body.Bytes(), &env) != nil || env.Error.Code != api.CodeInvalidRequest {
			t.Errorf("%s %q: %d %s; want 400 %s", api.HeaderTimeoutMs, v, rec.Code, rec.Body, api.CodeInvalidRequest)
		}
		if st, err := store.Inspect(context.Background(), "short-"+v); err != nil || st.Lease != nil || st.LastToken != 0 {
			t.Errorf("%s %q: the refusal left %+v (%v)", api.HeaderTimeoutMs, v, st, err)
		}
	}
	if n := store.calls.Load(); n != 0 {
		t.Errorf("refused requests reached the store %d times", n)
	}
}

// sliceStore is a memstore that records the least time any Acquire's
// context had left.
type sliceStore struct {
	store.LockStore
	mu    sync.Mutex
	least time.Duration
	asks  int
}

func (s *sliceStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (store.Lease, error) {
	if dl, ok := ctx.Deadline(); ok {
		s.mu.Lock()
		if left := time.Until(dl); s.asks == 0 || left < s.least {
			s.least = left
		}
		s.asks++
		s.mu.Unlock()
	}
	return s.LockStore.Acquire(ctx, key, owner, ttl)
}

// A waiting acquire stops asking while each ask still has the backend's
// minimum slice of the caller's budget (api.MinRequestTimeoutMs less
// DeadlineMargin): before, the head kept asking until the budget's end,
// and its last ask could get a millisecond, the same cut grant as a
// too-short budget.
func TestAWaitingAcquireNeverAsksWithLessThanTheMinimumSlice(t *testing.T) {
	store := &sliceStore{LockStore: memstore.New(nil)}
	cfg := lockserver.DefaultServerConfig()
	cfg.WaitPoll = 5 * time.Millisecond // ask often, up to the end
	h := serverWith(t, store, cfg)
	if _, err := store.LockStore.Acquire(context.Background(), "k", "other", time.Minute); err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest("POST", api.PathLockPrefix+"k"+api.SuffixAcquire, strings.NewReader(`{"owner":"w","ttlMs":60000,"waitMs":60000}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(api.HeaderTimeoutMs, "800")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusConflict {
		t.Fatalf("a wait on a held key: %d %s; want 409 %s", rec.Code, rec.Body, api.CodeLockHeld)
	}
	slice := time.Duration(api.MinRequestTimeoutMs)*time.Millisecond - lockserver.DeadlineMargin
	store.mu.Lock()
	defer store.mu.Unlock()
	if store.asks < 2 {
		t.Fatalf("the waiter asked %d times; want it to have waited and asked again", store.asks)
	}
	if store.least < slice-10*time.Millisecond {
		t.Errorf("an ask of the waiter had %v of the budget; want at least %v", store.least, slice)
	}
}

// frozenStore is a gateStore whose Renew, Revoke and Inspect wait for the
// gate too while it is held: every lock-server request meets a frozen
// backend.
type frozenStore struct{ *gateStore }

func (f frozenStore) Renew(ctx context.Context, key, owner string, token int64) (store.Lease, error) {
	if err := f.hold(ctx); err != nil {
		return store.Lease{}, err
	}
	return f.LockStore.Renew(ctx, key, owner, token)
}

func (f frozenStore) Revoke(ctx context.Context, key string, token int64) (store.Lease, error) {
	if err := f.hold(ctx); err != nil {
		return store.Lease{}, err
	}
	return f.LockStore.Revoke(ctx, key, token)
}

func (f frozenStore) Inspect(ctx context.Context, key string) (store.State, error) {
	if err := f.hold(ctx); err != nil {
		return store.State{}, err
	}
	return f.LockStore.Inspect(ctx, key)
}

// (stall9): while the backend was marked stalled, the one
// request let through every StallProbeInterval to probe it waited out the
// whole RequestTimeout (5 s, the callers' own budget), so its caller heard
// its own timeout instead of the 503. Now every probe (acquire, inspect,
// renew, revoke) gives the backend at most StallProbeTimeout, is answered
// 503 BACKEND_UNAVAILABLE with Retry-After when that runs out, keeps the
// backend marked stalled, and an answer clears the mark as before. The
// check is on the deadline lock-server gave the store (its own decision),
// not on elapsed time.
func TestAStallProbeIsBoundedByStallProbeTimeout(t *testing.T) {
	g := newGateStore()
	store := frozenStore{g}
	clock := &fakeNow{t: time.Unix(1_790_000_000, 0)}
	cfg := lockserver.DefaultServerConfig()
	cfg.RequestTimeout, cfg.StallProbeTimeout = 1500*time.Millisecond, 50*time.Millisecond
	cfg.StallProbeInterval, cfg.Now = time.Minute, clock.now
	h := serverWith(t, store, cfg)
	rec := acquireReq(h, "k")
	if rec.Code != http.StatusOK {
		t.Fatalf("acquire before the stall: %d %s", rec.Code, rec.Body)
	}
	var grant api.Grant
	if err := json.Unmarshal(rec.Body.Bytes(), &grant); err != nil {
		t.Fatal(err)
	}
	req := func(method, path, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		if body != "" {
			r.Header.Set("Content-Type", "application/json")
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec
	}
	g.held.Store(true)
	wantRefused(t, "the request that meets the frozen backend", acquireReq(h, "k1"), api.CodeBackendUnavailable)
	if left := <-g.entered; left <= cfg.StallProbeTimeout {
		t.Fatalf("a request before any stall had %v; want the whole RequestTimeout %v", left, cfg.RequestTimeout)
	}
	probes := []struct {
		name string
		do   func() *httptest.ResponseRecorder
	}{
		{"acquire", func() *httptest.ResponseRecorder { return acquireReq(h, "k1") }},
		{"inspect", func() *httptest.ResponseRecorder { return req("GET", api.PathLockPrefix+"k", "") }},
		{"renew", func() *httptest.ResponseRecorder {
			return req("POST", api.PathLockPrefix+"k"+api.SuffixRenew, fmt.Sprintf(`{"owner":"w","token":%d}`, grant.Token))
		}},
		{"revoke", func() *httptest.ResponseRecorder {
			return req("POST", api.PathLockPrefix+"k"+api.SuffixRevoke, fmt.Sprintf(`{"token":%d}`, grant.Token))
		}},
	}
	for _, p := range probes {
		clock.add(time.Minute) // the probe's turn
		calls := g.calls.Load()
		wantRefused(t, p.name+" probe", p.do(), api.CodeBackendUnavailable)
		if left := <-g.entered; left <= 0 || left > cfg.StallProbeTimeout {
			t.Fatalf("the %s probe gave the backend %v; want at most StallProbeTimeout %v (RequestTimeout is %v)",
				p.name, left, cfg.StallProbeTimeout, cfg.RequestTimeout)
		}
		if n := g.calls.Load() - calls; n != 1 {
			t.Fatalf("the %s probe made %d backend calls; want 1", p.name, n)
		}
		// The probe's timeout keeps the backend marked stalled: the next
		// request is refused without a backend call.
		wantRefused(t, "after the "+p.name+" probe", p.do(), api.CodeBackendUnavailable)
		if n := g.calls.Load() - calls; n != 1 {
			t.Fatalf("after the %s probe timed out the backend was called again (%d calls); want it still marked stalled", p.name, n)
		}
	}
	// The backend returns: the next probe gets the answer and clears the mark.
	g.held.Store(false)
	clock.add(time.Minute)
	if rec := req("GET", api.PathLockPrefix+"k", ""); rec.Code != http.StatusOK {
		t.Fatalf("the probe after recovery: %d %s", rec.Code, rec.Body)
	}
	if rec := acquireReq(h, "k2"); rec.Code != http.StatusOK {
		t.Fatalf("after recovery: %d %s", rec.Code, rec.Body)
	}
}
