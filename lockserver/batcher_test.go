package lockserver_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// gatedStore is a memstore whose first store call waits for gate, so that
// a test can queue requests behind a batch in flight, and which records
// the members of every call (a single call counts as a batch of one).
type gatedStore struct {
	*memstore.Store
	gate chan struct{}

	mu      sync.Mutex
	started bool
	calls   [][]string       // keys of each call, in order
	fail    map[string]error // the next call of this key fails so
	// holdMany, when not nil, holds every AcquireMany until it is closed.
	holdMany chan struct{}
}

func newGatedStore() *gatedStore {
	return &gatedStore{Store: memstore.New(nil), gate: make(chan struct{}), fail: map[string]error{}}
}

// enter records a call of keys and makes the first one wait for the gate.
func (s *gatedStore) enter(keys ...string) {
	s.mu.Lock()
	first := !s.started
	s.started = true
	s.calls = append(s.calls, keys)
	s.mu.Unlock()
	if first {
		<-s.gate
	}
}

// injected returns (and forgets) the failure planned for key.
func (s *gatedStore) injected(key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.fail[key]
	delete(s.fail, key)
	return err
}

func (s *gatedStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (store.Lease, error) {
	s.enter(key)
	if err := s.injected(key); err != nil {
		return store.Lease{}, err
	}
	return s.Store.Acquire(ctx, key, owner, ttl)
}

func (s *gatedStore) AcquireMany(ctx context.Context, reqs []store.AcquireRequest) []store.Result {
	keys := make([]string, len(reqs))
	for i, r := range reqs {
		keys[i] = r.Key
	}
	s.enter(keys...)
	if s.holdMany != nil {
		<-s.holdMany
	}
	out := make([]store.Result, len(reqs))
	for i, r := range reqs {
		if err := s.injected(r.Key); err != nil {
			out[i].Err = err
			continue
		}
		out[i].Lease, out[i].Err = s.Store.Acquire(ctx, r.Key, r.Owner, r.TTL)
	}
	return out
}

func (s *gatedStore) Release(ctx context.Context, key, owner string, token int64) error {
	s.enter(key)
	return s.Store.Release(ctx, key, owner, token)
}

func (s *gatedStore) ReleaseMany(ctx context.Context, refs []store.LeaseRef) []error {
	keys := make([]string, len(refs))
	for i, r := range refs {
		keys[i] = r.Key
	}
	s.enter(keys...)
	return s.Store.ReleaseMany(ctx, refs)
}

func (s *gatedStore) callKeys() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

func newBatcher(t *testing.T, s store.LockStore) *lockserver.Batcher {
	t.Helper()
	b, err := lockserver.NewBatcher(s, lockserver.DefaultBatchConfig())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type answer struct {
	lease store.Lease
	err   error
}

// TestAcquiresQueuedBehindABatchShareOneStoreCall: while one acquire is in
// flight, six more arrive: three free keys, one held key, and two more
// acquires of one of the free keys. They reach the store as one call of
// four members (a key once); the free keys are granted, the held one is
// refused, and the two repeats are refused as held, since the first
// acquire of their key was granted.
func TestAcquiresQueuedBehindABatchShareOneStoreCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newGatedStore()
		b := newBatcher(t, s)
		held, err := s.Store.Acquire(t.Context(), "held", "holder", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		answers := make([]answer, 7)
		keys := []string{"first", "b", "c", "held", "d", "b", "b"}
		var wg sync.WaitGroup
		start := func(i int) {
			wg.Go(func() {
				l, err := b.Acquire(t.Context(), keys[i], fmt.Sprintf("owner-%d", i), time.Minute)
				answers[i] = answer{l, err}
			})
		}
		start(0)
		synctest.Wait() // the first acquire waits in the store
		for i := 1; i < len(keys); i++ {
			start(i)
			synctest.Wait() // queued, in this order
		}
		close(s.gate)
		wg.Wait()

		want := [][]string{{"first"}, {"b", "c", "held", "d"}}
		if got := s.callKeys(); !slices.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("store calls %v; want %v", got, want)
		}
		for _, i := range []int{0, 1, 2, 4} {
			if a := answers[i]; a.err != nil || a.lease.Key != keys[i] || a.lease.Owner != fmt.Sprintf("owner-%d", i) || a.lease.Token <= held.Token {
				t.Errorf("acquire %d of %q: %+v, %v; want granted to owner-%d with a token above %d", i, keys[i], a.lease, a.err, i, held.Token)
			}
		}
		for _, i := range []int{3, 5, 6} {
			if !errors.Is(answers[i].err, store.ErrLockHeld) {
				t.Errorf("acquire %d of %q: %+v, %v; want ErrLockHeld", i, keys[i], answers[i].lease, answers[i].err)
			}
		}
		if st, _ := s.Inspect(t.Context(), "b"); st.Lease == nil || st.Lease.Owner != "owner-1" {
			t.Errorf("key b: %+v; want held by owner-1, the first of its acquires", st.Lease)
		}
		a, _, _ := b.Stats()
		if a.Calls != 2 || a.Requests != 7 {
			t.Errorf("acquire stats %+v; want 2 calls for 7 requests", a)
		}
	})
}

// TestARepeatedKeyWhoseFirstAcquireFailedGoesInTheNextBatch: when the
// first acquire of a key in a batch fails with anything but ErrLockHeld
// (here the backend did not answer for it), a repeat of that key learns
// nothing from it and is sent in the next batch, where it is granted.
func TestARepeatedKeyWhoseFirstAcquireFailedGoesInTheNextBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newGatedStore()
		s.fail["k"] = fmt.Errorf("%w: injected", store.ErrUnavailable)
		b := newBatcher(t, s)
		answers := make([]answer, 4)
		keys := []string{"first", "k", "other", "k"}
		var wg sync.WaitGroup
		for i := range keys {
			wg.Go(func() {
				l, err := b.Acquire(t.Context(), keys[i], fmt.Sprintf("owner-%d", i), time.Minute)
				answers[i] = answer{l, err}
			})
			synctest.Wait()
		}
		close(s.gate)
		wg.Wait()
		want := [][]string{{"first"}, {"k", "other"}, {"k"}}
		if got := s.callKeys(); !slices.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("store calls %v; want %v", got, want)
		}
		if !errors.Is(answers[1].err, store.ErrUnavailable) {
			t.Errorf("first acquire of k: %v; want the injected ErrUnavailable", answers[1].err)
		}
		if a := answers[3]; a.err != nil || a.lease.Owner != "owner-3" {
			t.Errorf("repeated acquire of k: %+v, %v; want granted in the next batch", a.lease, a.err)
		}
	})
}

// TestRepeatedReleasesOfAKeyAreJudgedOneAfterTheOther: two releases of one
// key wait behind a batch in flight, the first by another owner, the second
// by the holder. They cannot share a store call; each is answered as a
// release of its own: the first ErrNotHeld, the second released.
func TestRepeatedReleasesOfAKeyAreJudgedOneAfterTheOther(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newGatedStore()
		b := newBatcher(t, s)
		l, err := s.Store.Acquire(t.Context(), "k", "holder", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		other, err := s.Store.Acquire(t.Context(), "other", "holder", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		errs := make([]error, 3)
		calls := []store.LeaseRef{{Key: "other", Owner: "holder", Token: other.Token}, {Key: "k", Owner: "mallory", Token: l.Token}, {Key: "k", Owner: "holder", Token: l.Token}}
		var wg sync.WaitGroup
		for i, c := range calls {
			wg.Go(func() { errs[i] = b.Release(t.Context(), c.Key, c.Owner, c.Token) })
			synctest.Wait()
		}
		close(s.gate)
		wg.Wait()
		want := [][]string{{"other"}, {"k"}, {"k"}}
		if got := s.callKeys(); !slices.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("store calls %v; want %v", got, want)
		}
		if errs[0] != nil || !errors.Is(errs[1], store.ErrNotHeld) || errs[2] != nil {
			t.Fatalf("answers %v; want nil, ErrNotHeld, nil", errs)
		}
	})
}

// TestACallWhoseContextEndsWhileQueuedIsNeverSent: an acquire queued
// behind a batch in flight whose context ends is answered ErrUnavailable
// at once and never reaches the store; the others queued with it are
// served.
func TestACallWhoseContextEndsWhileQueuedIsNeverSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newGatedStore()
		b := newBatcher(t, s)
		var wg sync.WaitGroup
		var first, gone, after answer
		wg.Go(func() { first.lease, first.err = b.Acquire(t.Context(), "first", "w", time.Minute) })
		synctest.Wait()
		ctx, cancel := context.WithCancel(t.Context())
		wg.Go(func() { gone.lease, gone.err = b.Acquire(ctx, "gone", "w", time.Minute) })
		synctest.Wait()
		wg.Go(func() { after.lease, after.err = b.Acquire(t.Context(), "after", "w", time.Minute) })
		synctest.Wait()
		cancel()
		synctest.Wait()
		if !errors.Is(gone.err, store.ErrUnavailable) || !strings.Contains(gone.err.Error(), "nothing was done") {
			t.Fatalf("acquire with an ended context: %v; want ErrUnavailable, nothing done", gone.err)
		}
		close(s.gate)
		wg.Wait()
		want := [][]string{{"first"}, {"after"}}
		if got := s.callKeys(); !slices.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("store calls %v; want %v", got, want)
		}
		if first.err != nil || after.err != nil {
			t.Fatalf("the others: %v, %v; want granted", first.err, after.err)
		}
		if st, _ := s.Inspect(t.Context(), "gone"); st.Lease != nil {
			t.Fatalf("key gone is held by %+v", *st.Lease)
		}
	})
}

// heldBatch is a Batcher over a gatedStore whose second store call, the
// batch of "kept" and a leaver (an acquire of key whose context cancel
// ends), is held in AcquireMany until s.holdMany is closed; "first", the
// call in flight they queued behind, has been answered. The answers
// arrive in first, kept and leaver once wg is done. Call it inside a
// synctest bubble.
type heldBatch struct {
	s                   *gatedStore
	b                   *lockserver.Batcher
	wg                  sync.WaitGroup
	first, kept, leaver answer
	cancel              context.CancelFunc
}

func holdBatchWithALeaver(t *testing.T, key string) *heldBatch {
	hb := &heldBatch{s: newGatedStore()}
	hb.s.holdMany = make(chan struct{})
	hb.b = newBatcher(t, hb.s)
	hb.wg.Go(func() { hb.first.lease, hb.first.err = hb.b.Acquire(t.Context(), "first", "w", time.Minute) })
	synctest.Wait()
	// kept first: the first call waiting takes the lead and runs the next
	// batch on its own goroutine, so it cannot leave mid-batch.
	hb.wg.Go(func() { hb.kept.lease, hb.kept.err = hb.b.Acquire(t.Context(), "kept", "w", time.Minute) })
	synctest.Wait()
	ctx, cancel := context.WithCancel(t.Context())
	hb.cancel = cancel
	hb.wg.Go(func() { hb.leaver.lease, hb.leaver.err = hb.b.Acquire(ctx, key, "w", time.Minute) })
	synctest.Wait()
	close(hb.s.gate) // the first call answers; the batch of kept and the leaver is held
	synctest.Wait()
	return hb
}

// TestAGrantWhoseCallerLeftMidBatchIsReleased: two acquires queued behind
// a call in flight go as one batch; the second one's caller leaves while
// that batch is in flight (told: outcome unknown). The batch grants both;
// the Batcher releases the grant nobody will learn of, and keeps the
// other.
func TestAGrantWhoseCallerLeftMidBatchIsReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hb := holdBatchWithALeaver(t, "gone")
		s, b, cancel := hb.s, hb.b, hb.cancel
		first, kept, gone := &hb.first, &hb.kept, &hb.leaver
		wg := &hb.wg
		cancel()
		synctest.Wait()
		if !errors.Is(gone.err, store.ErrUnavailable) || !strings.Contains(gone.err.Error(), "outcome is unknown") {
			close(s.holdMany)
			t.Fatalf("acquire whose context ended mid-batch: %v; want ErrUnavailable, outcome unknown", gone.err)
		}
		close(s.holdMany)
		wg.Wait()
		if err := b.Close(); err != nil { // waits for the abandoned grant's release
			t.Fatal(err)
		}
		// The last call is the release of the grant nobody learned of.
		want := [][]string{{"first"}, {"kept", "gone"}, {"gone"}}
		if got := s.callKeys(); !slices.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("store calls %v; want %v", got, want)
		}
		if first.err != nil || kept.err != nil {
			t.Fatalf("the others: %v, %v; want granted", first.err, kept.err)
		}
		if st, _ := s.Inspect(t.Context(), "gone"); st.Lease != nil {
			t.Fatalf("key gone is held by %+v, granted to a caller that had left", *st.Lease)
		}
		if st, _ := s.Inspect(t.Context(), "kept"); st.Lease == nil || st.Lease.Token != kept.lease.Token {
			t.Fatalf("key kept: %+v; want the grant answered, token %d", st.Lease, kept.lease.Token)
		}
		if n := b.Abandoned(); n != 1 {
			t.Fatalf("Abandoned() = %d, want 1", n)
		}
	})
}

// TestAGrantAbandonedAfterCloseIsNotReleased: Close begins while a batch
// holding a caller that has left is in flight. The Batcher starts no
// release after Close began (it would use a closed store, and join a
// wait already under way); that grant ends by its TTL.
func TestAGrantAbandonedAfterCloseIsNotReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hb := holdBatchWithALeaver(t, "gone")
		hb.cancel()
		synctest.Wait()
		if err := hb.b.Close(); err != nil {
			t.Fatal(err)
		}
		close(hb.s.holdMany)
		hb.wg.Wait()
		synctest.Wait()
		want := [][]string{{"first"}, {"kept", "gone"}}
		if got := hb.s.callKeys(); !slices.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("store calls %v; want %v: no release after Close", got, want)
		}
		if n := hb.b.Abandoned(); n != 0 {
			t.Fatalf("Abandoned() = %d, want 0", n)
		}
	})
}

// TestABatcherOverAStoreWithoutTheCapabilityCallsItDirectly.
func TestABatcherOverAStoreWithoutTheCapabilityCallsItDirectly(t *testing.T) {
	s := &plainStore{memstore.New(nil)}
	b := newBatcher(t, s)
	if _, err := b.Acquire(t.Context(), "k", "w", time.Minute); err != nil {
		t.Fatal(err)
	}
	if a, r, n := b.Stats(); a != (lockserver.BatchStats{}) || r != a || n != a {
		t.Fatalf("stats %+v %+v %+v; want none: nothing is batched", a, r, n)
	}
}

// plainStore hides memstore's batch methods.
type plainStore struct{ s *memstore.Store }

func (p *plainStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (store.Lease, error) {
	return p.s.Acquire(ctx, key, owner, ttl)
}
func (p *plainStore) Renew(ctx context.Context, key, owner string, token int64) (store.Lease, error) {
	return p.s.Renew(ctx, key, owner, token)
}
func (p *plainStore) Release(ctx context.Context, key, owner string, token int64) error {
	return p.s.Release(ctx, key, owner, token)
}
func (p *plainStore) Revoke(ctx context.Context, key string, token int64) (store.Lease, error) {
	return p.s.Revoke(ctx, key, token)
}
func (p *plainStore) Inspect(ctx context.Context, key string) (store.State, error) {
	return p.s.Inspect(ctx, key)
}
func (p *plainStore) Ping(ctx context.Context) error { return p.s.Ping(ctx) }
func (p *plainStore) Close() error                   { return p.s.Close() }

func TestBatchConfigValidateReportsEveryField(t *testing.T) {
	err := lockserver.BatchConfig{MaxSize: 0, Window: time.Second, Timeout: 0}.Validate()
	for _, want := range []string{"MaxSize", "Window", "Timeout"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v; want an error naming %s", err, want)
		}
	}
	if err := lockserver.DefaultBatchConfig().Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

// panickyStore panics on its first Acquire.
type panickyStore struct {
	*memstore.Store
	once sync.Once
}

func (p *panickyStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (store.Lease, error) {
	p.once.Do(func() { panic("injected") })
	return p.Store.Acquire(ctx, key, owner, ttl)
}

// TestAStorePanicAnswersItsBatchAndTheQueueGoesOn: a store call that
// panics is answered as an error to its members, and the next request is
// served (the lead is handed on, not lost with the panicking goroutine).
func TestAStorePanicAnswersItsBatchAndTheQueueGoesOn(t *testing.T) {
	b := newBatcher(t, &panickyStore{Store: memstore.New(nil)})
	if _, err := b.Acquire(t.Context(), "k", "w", time.Minute); err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("first acquire: %v; want the store's panic as an error", err)
	}
	if _, err := b.Acquire(t.Context(), "k", "w", time.Minute); err != nil {
		t.Fatalf("second acquire: %v; want granted", err)
	}
}
