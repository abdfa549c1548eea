package lockserver_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/logjson"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/logtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// abandonStore is a memstore (batches and handoffs included) whose calls
// a test can hold, to make a grant that its request abandons:
//
//   - the first single Acquire waits for gate (when not nil), so that
//     later acquires queue behind it in a Batcher and go as one batch;
//   - every AcquireMany waits for holdMany (when not nil);
//   - an Acquire of an owner in afterGrant grants the key (whatever its
//     context says), then calls that owner's function before answering:
//     the test ends the request there, as the backend grants it;
//   - a Release (single or batched) or a Handoff from a lease of
//     holdOwner closes relEntered and waits for relGate.
//
// Create it inside the synctest bubble of the test that uses it.
type abandonStore struct {
	*memstore.Store

	mu         sync.Mutex
	gate       chan struct{}
	gateUsed   bool
	holdMany   chan struct{}
	afterGrant map[string]func()
	holdOwner  string
	relEntered chan struct{}
	relGate    chan struct{}
}

func newAbandonStore() *abandonStore {
	return &abandonStore{Store: memstore.New(nil), afterGrant: map[string]func(){}}
}

// holdReleasesOf makes the next release or handoff from a lease of owner
// wait: entered is closed when it gets there, and it goes on once gate is
// closed.
func (s *abandonStore) holdReleasesOf(owner string) (entered, gate chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holdOwner, s.relEntered, s.relGate = owner, make(chan struct{}), make(chan struct{})
	return s.relEntered, s.relGate
}

func (s *abandonStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (store.Lease, error) {
	s.mu.Lock()
	var gate chan struct{}
	if s.gate != nil && !s.gateUsed {
		gate, s.gateUsed = s.gate, true
	}
	after := s.afterGrant[owner]
	s.mu.Unlock()
	if gate != nil {
		<-gate
	}
	if after == nil {
		return s.Store.Acquire(ctx, key, owner, ttl)
	}
	l, err := s.Store.Acquire(context.WithoutCancel(ctx), key, owner, ttl)
	after()
	return l, err
}

func (s *abandonStore) AcquireMany(ctx context.Context, reqs []store.AcquireRequest) []store.Result {
	s.mu.Lock()
	hold := s.holdMany
	s.mu.Unlock()
	if hold != nil {
		<-hold
	}
	return s.Store.AcquireMany(ctx, reqs)
}

// held waits at the release gate if owner's releases are held.
func (s *abandonStore) held(owner string) {
	s.mu.Lock()
	var entered, gate chan struct{}
	if s.relGate != nil && owner == s.holdOwner {
		entered, gate = s.relEntered, s.relGate
		s.relEntered, s.relGate, s.holdOwner = nil, nil, ""
	}
	s.mu.Unlock()
	if gate != nil {
		close(entered)
		<-gate
	}
}

func (s *abandonStore) Release(ctx context.Context, key, owner string, token int64) error {
	s.held(owner)
	return s.Store.Release(ctx, key, owner, token)
}

func (s *abandonStore) ReleaseMany(ctx context.Context, refs []store.LeaseRef) []error {
	for _, r := range refs {
		s.held(r.Owner)
	}
	return s.Store.ReleaseMany(ctx, refs)
}

func (s *abandonStore) Handoff(ctx context.Context, from store.LeaseRef, to store.AcquireRequest) (store.Lease, error) {
	s.held(from.Owner)
	return s.Store.Handoff(ctx, from, to)
}

// abandonServer is a Server over store with a registry and its logs in
// logs; mod adjusts its configuration.
func abandonServer(t *testing.T, store store.LockStore, mod func(*lockserver.ServerConfig)) (*lockserver.Server, *logtest.Buffer) {
	t.Helper()
	cfg := lockserver.DefaultServerConfig()
	cfg.Registry = prometheus.NewRegistry()
	if mod != nil {
		mod(&cfg)
	}
	logs := &logtest.Buffer{}
	h, err := lockserver.NewServer(store, cfg, slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	return h, logs
}

// send serves r on its own goroutine; the answer arrives on the channel.
func send(h http.Handler, r *http.Request) <-chan *httptest.ResponseRecorder {
	out := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		out <- rec
	}()
	return out
}

// leftBatch is a Server (group grant on) over an abandonStore where an
// acquire of key by "leaver", a member (not the leader) of a batch, had
// its caller leave while the batch was in flight; the batch then granted
// it the key with a TTL of a minute, and the Server's release of that
// abandoned grant is held in the store (relEntered closed) until relGate
// is closed. Call it inside a synctest bubble.
type leftBatch struct {
	h       *lockserver.Server
	store   *abandonStore
	logs    *logtest.Buffer
	relGate chan struct{}
}

func batchWithALeaver(t *testing.T, key string, mod func(*lockserver.ServerConfig)) *leftBatch {
	t.Helper()
	s := newAbandonStore()
	s.gate, s.holdMany = make(chan struct{}), make(chan struct{})
	h, logs := abandonServer(t, s, mod)
	first := send(h, waitAcquireTTL(t.Context(), "first", "w", 60_000, 0))
	synctest.Wait() // in the store, at the gate
	// kept first: the first call queued takes the lead and sends the next
	// batch itself, so it cannot leave mid-batch; the leaver can.
	kept := send(h, waitAcquireTTL(t.Context(), "kept", "w", 60_000, 0))
	synctest.Wait()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	leaver := send(h, waitAcquireTTL(ctx, key, "leaver", 60_000, 0))
	synctest.Wait()
	close(s.gate) // first is answered; kept and leaver go as one batch, held
	synctest.Wait()
	if rec := <-first; rec.Code != http.StatusOK {
		t.Fatalf("first: %d %s", rec.Code, rec.Body)
	}
	cancel()
	if rec := <-leaver; rec.Code != api.StatusRequestCancelled {
		close(s.holdMany)
		t.Fatalf("leaver, gone mid-batch: %d %s; want %d", rec.Code, rec.Body, api.StatusRequestCancelled)
	}
	entered, relGate := s.holdReleasesOf("leaver")
	close(s.holdMany) // the batch grants kept and the leaver
	if rec := <-kept; rec.Code != http.StatusOK {
		t.Fatalf("kept: %d %s", rec.Code, rec.Body)
	}
	synctest.Wait()
	select {
	case <-entered:
	default:
		t.Fatal("the leaver's abandoned grant was never released")
	}
	if l := liveLease(t, s, key); l == nil || l.Owner != "leaver" {
		t.Fatalf("key %q: %+v; want the leaver's grant, its release held", key, l)
	}
	return &leftBatch{h: h, store: s, logs: logs, relGate: relGate}
}

// TestCloseWaitsForTheReleaseOfAnAbandonedBatchGrant: the release of a
// batch member's grant whose caller had left is still in the store when
// Close is called; Close returns only once that release has ended, and
// the key is then free.
func TestCloseWaitsForTheReleaseOfAnAbandonedBatchGrant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const key = "payout:acct-close"
		lb := batchWithALeaver(t, key, nil)
		closed := make(chan error, 1)
		go func() { closed <- lb.h.Close() }()
		synctest.Wait()
		select {
		case err := <-closed:
			close(lb.relGate)
			t.Fatalf("Close returned %v while the release of an abandoned grant was still in the store", err)
		default:
		}
		close(lb.relGate)
		if err := <-closed; err != nil {
			t.Fatalf("Close: %v", err)
		}
		if l := liveLease(t, lb.store, key); l != nil {
			t.Fatalf("key %q after Close: held by %+v; want released", key, *l)
		}
		if got := testutil.ToFloat64(lb.h.AbandonedCounter().WithLabelValues("released")); got != 1 {
			t.Fatalf("lockserver_abandoned_grants_total{outcome=released} = %v, want 1", got)
		}
		if ev := lb.logs.Events(t, lockserver.EventGrantAbandoned); len(ev) != 1 || ev[0]["key"] != key || ev[0]["where"] != "batch" {
			t.Fatalf("%s lines %v; want one for %q, where batch", lockserver.EventGrantAbandoned, ev, key)
		}
	})
}

// TestCloseGivesUpOnAReleaseThatDoesNotEnd: a release that the store
// never answers holds Close for RequestTimeout plus CloseSlack, no more;
// Close then returns ErrCloseTimedOut, and again, at once, when called a
// second time.
func TestCloseGivesUpOnAReleaseThatDoesNotEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lb := batchWithALeaver(t, "payout:acct-stuck", nil)
		defer close(lb.relGate)
		start := time.Now()
		err := lb.h.Close()
		if !errors.Is(err, lockserver.ErrCloseTimedOut) {
			t.Fatalf("Close: %v; want ErrCloseTimedOut", err)
		}
		want := lockserver.DefaultServerConfig().RequestTimeout + lockserver.CloseSlack
		if waited := time.Since(start); waited != want {
			t.Fatalf("Close waited %v, want %v", waited, want)
		}
		start = time.Now()
		if again := lb.h.Close(); !errors.Is(again, lockserver.ErrCloseTimedOut) || time.Since(start) != 0 {
			t.Fatalf("second Close: %v after %v; want the same error at once", again, time.Since(start))
		}
	})
}

// TestAWaiterIsWokenWhenAnAbandonedBatchGrantIsReleased: a waiter parks
// on a key held by a batch member's grant whose caller had left; when the
// Server's release of that grant ends, the waiter is granted at once,
// not after WaitPoll (10 s here; the grant's TTL is a minute).
func TestAWaiterIsWokenWhenAnAbandonedBatchGrantIsReleased(t *testing.T) {
	for _, handoff := range []bool{false, true} {
		t.Run(map[bool]string{false: "release-and-wake", true: "handoff"}[handoff], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const key = "payout:acct-wake"
				lb := batchWithALeaver(t, key, func(c *lockserver.ServerConfig) {
					c.WaitPoll = lockserver.MaxWaitPoll
					c.Handoff = handoff
				})
				waiter := send(lb.h, waitAcquireTTL(t.Context(), key, "waiter", 60_000, api.MaxWaitMs))
				synctest.Wait()
				if !lb.h.HeadParked(key) {
					close(lb.relGate)
					t.Fatal("the waiter is not parked behind the abandoned grant")
				}
				start := time.Now()
				close(lb.relGate)
				rec := <-waiter
				if rec.Code != http.StatusOK {
					t.Fatalf("waiter: %d %s", rec.Code, rec.Body)
				}
				if waited := time.Since(start); waited >= lockserver.MaxWaitPoll {
					t.Fatalf("the waiter was granted %v after the abandoned grant's release: it was not woken, its poll found the key", waited)
				}
				if err := lb.h.Close(); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// TestABatchLeaderWhoseRequestEndsMidBatchHasItsGrantReleased: the
// leader of a batch of two sends it on a context the request's end does
// not cancel; its request ends while the batch is in flight, the batch
// grants it the key, and the handler, finding the request ended before
// it wrote the grant, answers an error and releases the grant.
func TestABatchLeaderWhoseRequestEndsMidBatchHasItsGrantReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const key = "payout:acct-leader"
		s := newAbandonStore()
		s.gate, s.holdMany = make(chan struct{}), make(chan struct{})
		h, logs := abandonServer(t, s, nil)
		first := send(h, waitAcquireTTL(t.Context(), "first", "w", 60_000, 0))
		synctest.Wait()
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		leader := send(h, waitAcquireTTL(ctx, key, "leader", 60_000, 0))
		synctest.Wait()
		other := send(h, waitAcquireTTL(t.Context(), "other", "w", 60_000, 0))
		synctest.Wait()
		close(s.gate) // the leader sends itself and other as one batch, held
		synctest.Wait()
		<-first
		cancel()
		synctest.Wait() // the leader cannot leave: it waits for its batch
		close(s.holdMany)
		if rec := <-leader; rec.Code != api.StatusRequestCancelled {
			t.Fatalf("leader: %d %s; want %d: its request had ended before the grant was written", rec.Code, rec.Body, api.StatusRequestCancelled)
		}
		if rec := <-other; rec.Code != http.StatusOK {
			t.Fatalf("other: %d %s", rec.Code, rec.Body)
		}
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
		if l := liveLease(t, s, key); l != nil {
			t.Fatalf("key %q: held by %+v, granted to a request that had ended; want released", key, *l)
		}
		if got := testutil.ToFloat64(h.AbandonedCounter().WithLabelValues("released")); got != 1 {
			t.Fatalf("lockserver_abandoned_grants_total{outcome=released} = %v, want 1", got)
		}
		if ev := logs.Events(t, lockserver.EventGrantAbandoned); len(ev) != 1 || ev[0]["where"] != "answer" || ev[0]["owner"] != "leader" {
			t.Fatalf("%s lines %v; want one for the leader, where answer", lockserver.EventGrantAbandoned, ev)
		}
		for _, e := range logs.Events(t, lockserver.EventLockGranted) {
			if e["owner"] == "leader" {
				t.Fatalf("%s logged for the leader's grant, which was never answered: %v", lockserver.EventLockGranted, e)
			}
		}
	})
}

// TestAPlainAcquireWhoseRequestEndsAsItIsGrantedLeavesTheKeyFree: the
// backend grants a plain acquire (batched, a batch of one, or not) just
// as its request ends. The caller is answered an error, never the grant,
// and the grant is released: another owner's acquire right after
// succeeds (not after the first grant's minute of TTL).
func TestAPlainAcquireWhoseRequestEndsAsItIsGrantedLeavesTheKeyFree(t *testing.T) {
	for _, batching := range []bool{false, true} {
		t.Run(map[bool]string{false: "single", true: "batcher"}[batching], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const key = "payout:acct-plain"
				s := newAbandonStore()
				h, _ := abandonServer(t, s, func(c *lockserver.ServerConfig) { c.Batching = batching })
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				s.afterGrant["gone"] = cancel
				rec := <-send(h, waitAcquireTTL(ctx, key, "gone", 60_000, 0))
				if rec.Code == http.StatusOK {
					t.Fatalf("the ended request was answered its grant: %s", rec.Body)
				}
				if rec.Code != api.StatusRequestCancelled {
					t.Fatalf("ended request: %d %s; want %d", rec.Code, rec.Body, api.StatusRequestCancelled)
				}
				synctest.Wait() // the background release has ended
				next := <-send(h, waitAcquireTTL(t.Context(), key, "next", 60_000, 0))
				if next.Code != http.StatusOK {
					t.Fatalf("the next acquire: %d %s; want granted at once, the abandoned grant released", next.Code, next.Body)
				}
				if got := testutil.ToFloat64(h.AbandonedCounter().WithLabelValues("released")); got != 1 {
					t.Fatalf("lockserver_abandoned_grants_total{outcome=released} = %v, want 1", got)
				}
				if err := h.Close(); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// TestAParkedWaiterGetsTheKeyOfAnAbandonedPlainGrant: while the backend
// answers a plain acquire that granted the key, a waiter of the key
// parks (the key is held); the acquire's request ends before its answer.
// The release of the abandoned grant reaches the parked waiter at once:
// handed to it in the same store call when the store can, else released
// and the waiter woken; not after WaitPoll.
func TestAParkedWaiterGetsTheKeyOfAnAbandonedPlainGrant(t *testing.T) {
	for _, handoff := range []bool{false, true} {
		t.Run(map[bool]string{false: "release-and-wake", true: "handoff"}[handoff], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const key = "payout:acct-parked"
				s := newAbandonStore()
				h, _ := abandonServer(t, s, func(c *lockserver.ServerConfig) {
					c.Batching = false // the waiter's ask must not queue behind the grant in flight
					c.WaitPoll = lockserver.MaxWaitPoll
					c.Handoff = handoff
				})
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				granted, answer := make(chan struct{}), make(chan struct{})
				s.afterGrant["gone"] = func() {
					close(granted)
					<-answer
					cancel()
				}
				gone := send(h, waitAcquireTTL(ctx, key, "gone", 60_000, 0))
				<-granted
				waiter := send(h, waitAcquireTTL(t.Context(), key, "waiter", 60_000, api.MaxWaitMs))
				synctest.Wait()
				if !h.HeadParked(key) {
					close(answer)
					t.Fatal("the waiter is not parked behind the grant in flight")
				}
				start := time.Now()
				close(answer)
				if rec := <-gone; rec.Code != api.StatusRequestCancelled {
					t.Fatalf("gone: %d %s; want %d", rec.Code, rec.Body, api.StatusRequestCancelled)
				}
				rec := <-waiter
				if rec.Code != http.StatusOK {
					t.Fatalf("waiter: %d %s", rec.Code, rec.Body)
				}
				if waited := time.Since(start); waited >= lockserver.MaxWaitPoll {
					t.Fatalf("the waiter was granted %v after the abandoned grant: not woken, its poll found the key", waited)
				}
				// The waiter can be answered before the background release
				// counts itself: Close waits for that release.
				if err := h.Close(); err != nil {
					t.Fatal(err)
				}
				if got := testutil.ToFloat64(h.HandoffCounter().WithLabelValues("granted")); handoff != (got == 1) {
					t.Fatalf("handoffs granted: %v with handoff %v", got, handoff)
				}
				if got := testutil.ToFloat64(h.AbandonedCounter().WithLabelValues("released")); got != 1 {
					t.Fatalf("lockserver_abandoned_grants_total{outcome=released} = %v, want 1", got)
				}
			})
		})
	}
}

// TestTheReleaseOfAnAbandonedGrantIsLoggedWithTheRequestsTraceID: the
// grant_abandoned line is written after the answer, from the background
// release, yet carries the trace id of the request whose grant it
// released, as every line of that request does.
func TestTheReleaseOfAnAbandonedGrantIsLoggedWithTheRequestsTraceID(t *testing.T) {
	ctx, cancel := context.WithCancel(tracedContext(t))
	defer cancel()
	s := newAbandonStore()
	s.afterGrant["gone"] = cancel
	var buf bytes.Buffer
	h, err := lockserver.NewServer(s, lockserver.DefaultServerConfig(), logjson.New(&buf, slog.LevelDebug, false))
	if err != nil {
		t.Fatal(err)
	}
	if rec := <-send(h, waitAcquireTTL(ctx, "k", "gone", 60_000, 0)); rec.Code != api.StatusRequestCancelled {
		t.Fatalf("answer %d %s; want %d", rec.Code, rec.Body, api.StatusRequestCancelled)
	}
	if err := h.Close(); err != nil { // the release, and its line, are done
		t.Fatal(err)
	}
	abandoned := 0
	sc := bufio.NewScanner(&buf)
	for sc.Scan() {
		var l map[string]any
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("not JSON: %s", sc.Bytes())
		}
		if l["event"] == lockserver.EventGrantAbandoned {
			abandoned++
		}
		if l[logjson.KeyTraceID] != tracedID(ctx) {
			t.Errorf("line without the request's trace id (%s = %v; want %s):\n%s", logjson.KeyTraceID, l[logjson.KeyTraceID], tracedID(ctx), sc.Bytes())
		}
	}
	if abandoned != 1 {
		t.Fatalf("%d %s lines, want 1", abandoned, lockserver.EventGrantAbandoned)
	}
}
