package lockserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// releaseGateStore is a memstore (a Handoffer) that counts the acquires
// and handoffs each owner was asked for, granted or not, and holds the
// next Release of one key at a gate.
type releaseGateStore struct {
	*memstore.Store

	mu      sync.Mutex
	asks    map[string]int // Acquire and Handoff calls, by owner asked for
	key     string         // the next Release of this key waits for gate
	entered chan struct{}  // closed when that Release reaches the gate
	gate    chan struct{}
}

// holdRelease makes the next Release of key wait at a gate: entered is
// closed when it gets there, and it goes on when gate is closed.
func (s *releaseGateStore) holdRelease(key string) (entered, gate chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.key, s.entered, s.gate = key, make(chan struct{}), make(chan struct{})
	return s.entered, s.gate
}

func (s *releaseGateStore) asked(owner string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.asks[owner]
}

func (s *releaseGateStore) count(owner string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.asks == nil {
		s.asks = map[string]int{}
	}
	s.asks[owner]++
}

func (s *releaseGateStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (store.Lease, error) {
	s.count(owner)
	return s.Store.Acquire(ctx, key, owner, ttl)
}

func (s *releaseGateStore) Handoff(ctx context.Context, from store.LeaseRef, to store.AcquireRequest) (store.Lease, error) {
	s.count(to.Owner)
	return s.Store.Handoff(ctx, from, to)
}

func (s *releaseGateStore) Release(ctx context.Context, key, owner string, token int64) error {
	s.mu.Lock()
	var gate chan struct{}
	if key == s.key && s.gate != nil {
		close(s.entered)
		gate, s.key, s.gate = s.gate, "", nil
	}
	s.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return s.Store.Release(ctx, key, owner, token)
}

// releaseGateServer is a Server over a new releaseGateStore, group grant
// off (every grant one store call), with no poll (WaitPoll at its
// maximum), the handoff on or off. Call it inside a synctest bubble.
func releaseGateServer(t *testing.T, handoff bool) (*lockserver.Server, *releaseGateStore) {
	t.Helper()
	s := &releaseGateStore{Store: memstore.New(nil)}
	h, _ := abandonServer(t, s, func(cfg *lockserver.ServerConfig) {
		cfg.Batching, cfg.Handoff, cfg.WaitPoll = false, handoff, lockserver.MaxWaitPoll
	})
	return h, s
}

// acquired serves a plain acquire of key by owner and returns its grant.
func acquired(t *testing.T, h http.Handler, key, owner string) api.Grant {
	t.Helper()
	rec := <-send(h, waitAcquireTTL(t.Context(), key, owner, 30_000, 0))
	var g api.Grant
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &g) != nil {
		t.Fatalf("acquire %q by %s: %d %s", key, owner, rec.Code, rec.Body)
	}
	return g
}

// waiterDuringRelease has "holder" take holderKey and send its release
// (with the grant's token plus tokenDelta), held at s's gate; then
// "waiter" sends a waiting acquire of key, and the bubble settles. It
// returns the holder's grant, the release's and the waiter's answers,
// and the gate that lets the release go on.
func waiterDuringRelease(t *testing.T, h http.Handler, s *releaseGateStore, holderKey, key string, tokenDelta int64) (holder api.Grant, released, waiter <-chan *httptest.ResponseRecorder, gate chan struct{}) {
	t.Helper()
	holder = acquired(t, h, holderKey, "holder")
	entered, gate := s.holdRelease(holderKey)
	released = send(h, lockRequest(t.Context(), holderKey, api.SuffixRelease, api.ReleaseRequest{Owner: "holder", Token: holder.Token + tokenDelta}))
	<-entered
	waiter = send(h, waitAcquireTTL(t.Context(), key, "waiter", 30_000, 30_000))
	synctest.Wait()
	return holder, released, waiter, gate
}

// answered returns the answer on c, if it has come, or nil.
func answered(c <-chan *httptest.ResponseRecorder) *httptest.ResponseRecorder {
	select {
	case rec := <-c:
		return rec
	default:
		return nil
	}
}

// withAndWithoutHandoff runs test in a synctest bubble with the handoff
// on and off.
func withAndWithoutHandoff(t *testing.T, test func(t *testing.T, handoff bool)) {
	for _, handoff := range []bool{false, true} {
		name := "release-and-wake"
		if handoff {
			name = "handoff"
		}
		t.Run(name, func(t *testing.T) { synctest.Test(t, func(t *testing.T) { test(t, handoff) }) })
	}
}

// TestWaiterDuringARelease: a waiting acquire that arrives while the
// holder's release is in the backend does not ask (it would be refused);
// it is granted by one ask as soon as the release ends, no time passing.
func TestWaiterDuringARelease(t *testing.T) {
	withAndWithoutHandoff(t, func(t *testing.T, handoff bool) {
		const key = "payout:acct-release-in-flight"
		h, s := releaseGateServer(t, handoff)
		holder, released, waiter, gate := waiterDuringRelease(t, h, s, key, key, 0)
		if n := s.asked("waiter"); n != 0 || !h.HeadParked(key) {
			close(gate)
			t.Fatalf("during the release: the waiter was asked for %d times, parked %v; want 0 asks, parked", n, h.HeadParked(key))
		}
		start := time.Now()
		close(gate)
		synctest.Wait()
		if rec := answered(released); rec == nil || rec.Code != http.StatusNoContent {
			t.Fatalf("release: %v; want 204", rec)
		}
		rec := answered(waiter)
		if rec == nil || rec.Code != http.StatusOK {
			t.Fatalf("waiter after the release: %v; want 200 at once", rec)
		}
		var g api.Grant
		if err := json.Unmarshal(rec.Body.Bytes(), &g); err != nil || g.Owner != "waiter" || g.Token <= holder.Token {
			t.Fatalf("waiter's grant %+v (%v); want one above token %d", g, err, holder.Token)
		}
		if n, waited := s.asked("waiter"), time.Since(start); n != 1 || waited != 0 {
			t.Fatalf("the waiter was asked for %d times, granted %v after the release; want once, at once", n, waited)
		}
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestFailedReleaseWakesTheWaiter: a release refused by the backend (a
// stale token) also ends the waiter's park at once: it asks, is refused
// (the holder still holds the key), and is granted after the holder's own
// release.
func TestFailedReleaseWakesTheWaiter(t *testing.T) {
	withAndWithoutHandoff(t, func(t *testing.T, handoff bool) {
		const key = "payout:acct-failed-release"
		h, s := releaseGateServer(t, handoff)
		holder, stale, waiter, gate := waiterDuringRelease(t, h, s, key, key, 1)
		if n := s.asked("waiter"); n != 0 {
			close(gate)
			t.Fatalf("during the release: the waiter was asked for %d times; want 0", n)
		}
		start := time.Now()
		close(gate)
		synctest.Wait()
		if rec := answered(stale); rec == nil || rec.Code != http.StatusConflict {
			t.Fatalf("release with a stale token: %v; want 409", rec)
		}
		if n, since := s.asked("waiter"), time.Since(start); n != 1 || since != 0 || answered(waiter) != nil {
			t.Fatalf("after the failed release: the waiter was asked for %d times, %v later; want once, at once, and still waiting", n, since)
		}
		holderEndsAndWaiterIsWoken(t, h, key, "holder", holder.Token, "waiter", waiter)
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestReleaseOfAnotherKeyDoesNotHoldTheWaiter: a release in flight of
// one key leaves the waiters of another key alone.
func TestReleaseOfAnotherKeyDoesNotHoldTheWaiter(t *testing.T) {
	withAndWithoutHandoff(t, func(t *testing.T, handoff bool) {
		const key, other = "payout:acct-free", "payout:acct-other"
		h, s := releaseGateServer(t, handoff)
		_, released, waiter, gate := waiterDuringRelease(t, h, s, other, key, 0)
		rec := answered(waiter)
		close(gate)
		if rec == nil || rec.Code != http.StatusOK || s.asked("waiter") != 1 {
			t.Fatalf("waiter of %q while %q's release is in flight: %v after %d asks; want 200 at its first ask", key, other, rec, s.asked("waiter"))
		}
		if rec := <-released; rec.Code != http.StatusNoContent {
			t.Fatalf("release of %q: %d %s", other, rec.Code, rec.Body)
		}
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// orderedGateStore is a releaseGateStore that says it serves an acquire
// sent during a release after that release (store.ReleaseOrderer), as
// etcdstore does.
type orderedGateStore struct{ *releaseGateStore }

func (orderedGateStore) OrdersAfterRelease() bool { return true }

// TestWaiterAsksDuringAReleaseOnAnOrderedStore: over a store that orders
// an acquire after a release in flight, the waiter does not park for the
// release: it asks at once (here refused, the gated release not having
// reached the store), and is granted when the release ends.
func TestWaiterAsksDuringAReleaseOnAnOrderedStore(t *testing.T) {
	withAndWithoutHandoff(t, func(t *testing.T, handoff bool) {
		const key = "payout:acct-ordered"
		s := &releaseGateStore{Store: memstore.New(nil)}
		h, _ := abandonServer(t, orderedGateStore{s}, func(cfg *lockserver.ServerConfig) {
			cfg.Batching, cfg.Handoff, cfg.WaitPoll = false, handoff, lockserver.MaxWaitPoll
		})
		_, released, waiter, gate := waiterDuringRelease(t, h, s, key, key, 0)
		if n := s.asked("waiter"); n != 1 {
			close(gate)
			t.Fatalf("during the release: the waiter was asked for %d times; want 1 (no park on an ordered store)", n)
		}
		close(gate)
		synctest.Wait()
		if rec := answered(released); rec == nil || rec.Code != http.StatusNoContent {
			t.Fatalf("release: %v; want 204", rec)
		}
		if rec := answered(waiter); rec == nil || rec.Code != http.StatusOK {
			t.Fatalf("waiter after the release: %v; want 200 at once", rec)
		}
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
	})
}
