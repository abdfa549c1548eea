package lockserver_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// handoffStore is a recordingStore over a memstore that can also hand
// off (store.Handoffer): it records each handoff that took effect
// as a release of from and a grant to to, and can fail or hold the next
// handoff.
type handoffStore struct {
	*recordingStore
	mem *memstore.Store

	hmu      sync.Mutex
	handoffs []store.Lease
	failNext error         // the next Handoff returns this, changing nothing
	entered  chan struct{} // when not nil, the next Handoff closes it and waits for gate
	gate     chan struct{}
}

var _ store.Handoffer = (*handoffStore)(nil)

func newHandoffStore() *handoffStore {
	mem := memstore.New(nil)
	return &handoffStore{recordingStore: &recordingStore{LockStore: mem}, mem: mem}
}

func (s *handoffStore) Handoff(ctx context.Context, from store.LeaseRef, to store.AcquireRequest) (store.Lease, error) {
	s.hmu.Lock()
	fail, entered, gate := s.failNext, s.entered, s.gate
	s.failNext, s.entered, s.gate = nil, nil, nil
	s.hmu.Unlock()
	if entered != nil {
		close(entered)
		<-gate
	}
	if fail != nil {
		return store.Lease{}, fail
	}
	l, err := s.mem.Handoff(ctx, from, to)
	if err != nil {
		return l, err
	}
	s.hmu.Lock()
	s.handoffs = append(s.handoffs, l)
	s.hmu.Unlock()
	s.mu.Lock()
	s.released = append(s.released, from.Token)
	s.granted = append(s.granted, l)
	if s.history != nil {
		s.history.add("grant", to.Owner)
	}
	s.mu.Unlock()
	return l, nil
}

// handedOff returns the leases granted by handoffs so far.
func (s *handoffStore) handedOff() []store.Lease {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	return slices.Clone(s.handoffs)
}

// holdNext makes the next Handoff wait at a gate.
func (s *handoffStore) holdNext() (entered, gate chan struct{}) {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	s.entered, s.gate = make(chan struct{}), make(chan struct{})
	return s.entered, s.gate
}

func (s *handoffStore) failNextWith(err error) {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	s.failNext = err
}

// handoffServer is waitServer over a handoffStore.
func handoffServer(t *testing.T) (*lockserver.Server, *handoffStore) {
	t.Helper()
	store := newHandoffStore()
	cfg := lockserver.DefaultServerConfig()
	cfg.Batching = false
	h := serverWith(t, store, cfg)
	return h, store
}

// awaitParked waits until key's head waiter on h sleeps between asks.
func awaitParked(t *testing.T, h *lockserver.Server, key string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !h.HeadParked(key) {
		if time.Now().After(deadline) {
			t.Fatalf("the head waiter of %q never parked", key)
		}
		time.Sleep(time.Millisecond) // polling a condition, not a fixed sleep
	}
}

// awaitParkedUnanswered waits until key's head waiter on h sleeps
// between asks again, failing the test if the waiter is answered first.
func awaitParkedUnanswered(t *testing.T, h *lockserver.Server, key string, answer <-chan waitAnswer, after string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !h.HeadParked(key) {
		select {
		case a := <-answer:
			t.Fatalf("the waiter was answered %d %+v after %s; want it still waiting", a.status, a.grant, after)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the head waiter of %q never parked again after %s", key, after)
		}
		time.Sleep(time.Millisecond) // polling a condition, not a fixed sleep
	}
	select {
	case a := <-answer:
		t.Fatalf("the waiter was answered %d %+v after %s; want it still waiting", a.status, a.grant, after)
	default:
	}
}

// waitFor starts a waiting acquire of key by owner and returns where its
// answer arrives.
func waitFor(ctx context.Context, h http.Handler, key, owner string) <-chan waitAnswer {
	out := make(chan waitAnswer, 1)
	go func() {
		s, g := serve(h, waitAcquire(ctx, key, owner, 30_000))
		out <- waitAnswer{owner, s, g}
	}()
	return out
}

func releaseAnswer(h http.Handler, key, owner string, token int64) int {
	return do(h, http.MethodPost, api.PathLockPrefix+key+api.SuffixRelease, "application/json",
		fmt.Sprintf(`{"owner":%q,"token":%d}`, owner, token)).Code
}

// TestReleaseHandsTheKeyToTheParkedWaiter: the release and the waiter's
// grant are one store call (Handoff); the waiter does not ask again.
func TestReleaseHandsTheKeyToTheParkedWaiter(t *testing.T) {
	h, store := handoffServer(t)
	const key = "payout:acct-handoff"
	_, holder := serve(h, waitAcquire(t.Context(), key, "holder", 0))
	answer := waitFor(context.Background(), h, key, "waiter")
	awaitParked(t, h, key)
	asked := store.refusals("waiter")
	releaseGrant(t, h, holder)
	a := <-answer
	if a.status != http.StatusOK || a.grant.Owner != "waiter" || a.grant.Token <= holder.Token {
		t.Fatalf("waiter: %d %+v; want a grant above token %d", a.status, a.grant, holder.Token)
	}
	if got := store.handedOff(); len(got) != 1 || got[0].Token != a.grant.Token {
		t.Fatalf("handoffs %+v; want one, carrying the waiter's token %d", got, a.grant.Token)
	}
	if got := store.owners(); !slices.Equal(got, []string{"holder", "waiter"}) || store.refusals("waiter") != asked {
		t.Fatalf("grants %v, refusals %d (were %d): the waiter must not ask again after the handoff", got, store.refusals("waiter"), asked)
	}
	if code := releaseAnswer(h, key, "holder", holder.Token); code != http.StatusConflict {
		t.Fatalf("the holder's second release: %d, want 409 (its token is stale)", code)
	}
	releaseGrant(t, h, a.grant)
}

// TestRefusedHandoffChangesNothing: a release with a token that is not
// the live one is refused as a plain release is, the waiter is granted
// nothing and stays queued, and the key stays with its holder.
func TestRefusedHandoffChangesNothing(t *testing.T) {
	h, store := handoffServer(t)
	const key = "payout:acct-refused"
	_, holder := serve(h, waitAcquire(t.Context(), key, "holder", 0))
	answer := waitFor(context.Background(), h, key, "waiter")
	awaitParked(t, h, key)
	for _, bad := range []struct {
		owner string
		token int64
	}{{"holder", holder.Token + 1}, {"intruder", holder.Token}} {
		if code := releaseAnswer(h, key, bad.owner, bad.token); code != http.StatusConflict {
			t.Fatalf("release by %s with token %d: %d, want 409", bad.owner, bad.token, code)
		}
		awaitParkedUnanswered(t, h, key, answer, "a refused release")
		st, err := store.Inspect(t.Context(), key)
		if err != nil || st.Lease == nil || st.Lease.Owner != "holder" || st.Lease.Token != holder.Token || h.Waiting() != 1 {
			t.Fatalf("after a refused release: %+v %v, %d waiting; want the holder's lease and the waiter queued", st.Lease, err, h.Waiting())
		}
	}
	releaseGrant(t, h, holder)
	if a := <-answer; a.status != http.StatusOK || a.grant.Token <= holder.Token {
		t.Fatalf("waiter after the real release: %d %+v", a.status, a.grant)
	}
}

// parkedBehindASecondGrant builds a lock-server over a handoffStore with
// no poll (WaitPoll at its maximum: the head's only other reason to ask
// is the holder's expiry, 30 s away), grants key to "holder" twice (old,
// released, then holder, live), and parks a waiter behind it; answer is
// where the waiter's answer arrives. old.Token is a stale token of key.
func parkedBehindASecondGrant(t *testing.T, key string) (h *lockserver.Server, store *handoffStore, old, holder api.Grant, answer <-chan waitAnswer) {
	t.Helper()
	store = newHandoffStore()
	cfg := lockserver.DefaultServerConfig()
	cfg.Batching, cfg.WaitPoll = false, lockserver.MaxWaitPoll
	h = serverWith(t, store, cfg)
	_, old = serve(h, waitAcquire(t.Context(), key, "holder", 0))
	releaseGrant(t, h, old)
	_, holder = serve(h, waitAcquire(t.Context(), key, "holder", 0))
	answer = waitFor(context.Background(), h, key, "waiter")
	awaitParked(t, h, key)
	return h, store, old, holder, answer
}

// TestRefusedHandoffKeepsTheHeadParked: a refused release changed nothing,
// so the parked head sleeps on instead of asking the backend (an ask
// would be refused, and a head mid-ask when the holder's own release
// comes cannot be handed the key). Each refusal (a stale token, another
// owner) is followed by a wait for the first of: the head back to
// sleep, or its ask reaching the store (a failure); the holder's release
// must then be a handoff.
func TestRefusedHandoffKeepsTheHeadParked(t *testing.T) {
	const key = "payout:acct-refused-parked"
	h, store, old, holder, answer := parkedBehindASecondGrant(t, key)
	entered, gate := store.arm("waiter")
	defer close(gate)
	for _, bad := range []struct {
		owner string
		token int64
	}{{"holder", old.Token}, {"intruder", holder.Token}} {
		if code := releaseAnswer(h, key, bad.owner, bad.token); code != http.StatusConflict {
			t.Fatalf("release by %s with token %d: %d, want 409", bad.owner, bad.token, code)
		}
		awaitCond(t, "the head back to sleep, or asking", func() bool {
			select {
			case <-entered:
				return true
			default:
				return h.HeadParked(key)
			}
		})
		select {
		case <-entered:
			t.Fatalf("the head asked the store after the refused release by %s with token %d; want it parked until the holder's expiry", bad.owner, bad.token)
		default:
		}
	}
	releaseGrant(t, h, holder)
	a := <-answer
	if got := store.handedOff(); a.status != http.StatusOK || len(got) != 1 || got[0].Token != a.grant.Token {
		t.Fatalf("waiter: %d %+v, handoffs %+v; want the holder's release handed to it", a.status, a.grant, got)
	}
	releaseGrant(t, h, a.grant)
}

// TestARefusedHandoffDoesNotHideARealRelease: a stale release claims the
// parked head and its handoff is held in the store; the holder's real
// release comes meanwhile, finds the head claimed, releases and wakes it.
// When the stale handoff is then refused, the head must ask (the key is
// free), not sleep on as after a refusal alone: the wake it saw says the
// key changed.
func TestARefusedHandoffDoesNotHideARealRelease(t *testing.T) {
	const key = "payout:acct-refused-woken"
	h, store, old, holder, answer := parkedBehindASecondGrant(t, key)
	entered, gate := store.holdNext()
	stale := make(chan int, 1)
	go func() { stale <- releaseAnswer(h, key, "holder", old.Token) }()
	<-entered // the stale release's handoff is in the store, the head claimed
	releaseGrant(t, h, holder)
	// The head takes the wake before the refusal exists: without this
	// wait it may read both at once and take the refusal first, and the
	// wake left for its next sleep hides the hole this test is about.
	awaitCond(t, "the head woken, awaiting the stale handoff's outcome", func() bool { return h.HeadAwaitsHandoff(key) })
	close(gate)
	if code := <-stale; code != http.StatusConflict {
		t.Fatalf("stale release: %d, want 409", code)
	}
	var a waitAnswer
	awaitCond(t, "the waiter answered, or parked again", func() bool {
		select {
		case a = <-answer:
			return true
		default:
			return h.HeadParked(key)
		}
	})
	if a.owner == "" {
		t.Fatal("the head parked again after the refused handoff although the holder had released the key; want it to ask")
	}
	if a.status != http.StatusOK || a.grant.Token <= holder.Token {
		t.Fatalf("waiter: %d %+v; want a grant above token %d", a.status, a.grant, holder.Token)
	}
	releaseGrant(t, h, a.grant)
}

// TestHandoffOfUnknownOutcomeGrantsNothing: the handoff's outcome is
// unknown (ErrUnavailable). The release is answered 503 as a release of
// unknown outcome, the waiter is not answered a grant the backend did not
// confirm, and it goes back to asking; the holder's retried release then
// reaches it.
func TestHandoffOfUnknownOutcomeGrantsNothing(t *testing.T) {
	lockStore := newHandoffStore()
	cfg := lockserver.DefaultServerConfig()
	cfg.Batching, cfg.Registry = false, prometheus.NewRegistry()
	h := serverWith(t, lockStore, cfg)
	const key = "payout:acct-unknown"
	_, holder := serve(h, waitAcquire(t.Context(), key, "holder", 0))
	answer := waitFor(context.Background(), h, key, "waiter")
	awaitParked(t, h, key)
	lockStore.failNextWith(fmt.Errorf("%w: injected", store.ErrUnavailable))
	if code := releaseAnswer(h, key, "holder", holder.Token); code != http.StatusServiceUnavailable {
		t.Fatalf("release whose handoff's outcome is unknown: %d, want 503", code)
	}
	awaitParkedUnanswered(t, h, key, answer, "a handoff of unknown outcome") // it asked again and went back to sleep
	releaseGrant(t, h, holder)
	a := <-answer
	if a.status != http.StatusOK || a.grant.Token <= holder.Token {
		t.Fatalf("waiter: %d %+v", a.status, a.grant)
	}
	if got := lockStore.handedOff(); len(got) != 1 || got[0].Token != a.grant.Token {
		t.Fatalf("handoffs %+v; want the one of the retried release", got)
	}
	for outcome, want := range map[string]float64{"unknown": 1, "granted": 1, "refused": 0} {
		if got := testutil.ToFloat64(h.HandoffCounter().WithLabelValues(outcome)); got != want {
			t.Errorf("lockserver_handoffs_total{outcome=%q} = %v, want %v", outcome, got, want)
		}
	}
}

// TestHandoffToAGoneWaiterIsReleased: the waiter's request ends while the
// handoff to it is in flight. The grant is released at once (conditional
// on its token) and the next waiter gets the key.
func TestHandoffToAGoneWaiterIsReleased(t *testing.T) {
	h, store := handoffServer(t)
	const key = "payout:acct-gone-handoff"
	_, holder := serve(h, waitAcquire(t.Context(), key, "holder", 0))
	lateCtx, cancelLate := context.WithCancel(context.Background())
	defer cancelLate()
	late := waitFor(lateCtx, h, key, "late")
	awaitParked(t, h, key)
	next := waitFor(context.Background(), h, key, "next")
	awaitWaiting(t, h, 2)
	entered, gate := store.holdNext()
	released := make(chan int, 1)
	go func() { released <- releaseAnswer(h, key, "holder", holder.Token) }()
	<-entered
	cancelLate()
	close(gate)
	if code := <-released; code != http.StatusNoContent {
		t.Fatalf("holder's release: %d, want 204", code)
	}
	if a := <-late; a.status != api.StatusRequestCancelled {
		t.Fatalf("late: %d, want %d (its request ended)", a.status, api.StatusRequestCancelled)
	}
	a := <-next
	if a.status != http.StatusOK {
		t.Fatalf("next: %d, want granted", a.status)
	}
	hand := store.handedOff()
	if len(hand) == 0 || hand[0].Owner != "late" {
		t.Fatalf("handoffs %+v; want the first to late", hand)
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if !slices.Contains(store.released, hand[0].Token) {
		t.Fatalf("late's grant (token %d) was not released; released: %v", hand[0].Token, store.released)
	}
	if a.grant.Token <= hand[0].Token {
		t.Fatalf("next's token %d is not above late's %d", a.grant.Token, hand[0].Token)
	}
}

// TestReleaseWhileTheHeadAsksIsAPlainRelease: the head is in the middle
// of its own backend ask; the release is not handed off (it would race
// the head's ask) but released, and the head is woken as before.
func TestReleaseWhileTheHeadAsksIsAPlainRelease(t *testing.T) {
	h, store := handoffServer(t)
	const key = "payout:acct-mid-ask"
	_, holder := serve(h, waitAcquire(t.Context(), key, "holder", 0))
	answer := waitFor(context.Background(), h, key, "waiter")
	awaitParked(t, h, key)
	entered, gate := store.arm("waiter")
	// The head's next ask (after its poll interval) stops at the gate.
	<-entered
	releaseGrant(t, h, holder)
	close(gate)
	if a := <-answer; a.status != http.StatusOK || a.grant.Token <= holder.Token {
		t.Fatalf("waiter: %d %+v", a.status, a.grant)
	}
	if got := store.handedOff(); len(got) != 0 {
		t.Fatalf("handoffs %+v while the head was asking; want a plain release", got)
	}
}

// TestHandoffOffReleasesAndWakes: with ServerConfig.Handoff false, a
// release never hands off, whatever the store can do.
func TestHandoffOffReleasesAndWakes(t *testing.T) {
	store := newHandoffStore()
	cfg := lockserver.DefaultServerConfig()
	cfg.Batching, cfg.Handoff = false, false
	h := serverWith(t, store, cfg)
	const key = "payout:acct-off"
	_, holder := serve(h, waitAcquire(t.Context(), key, "holder", 0))
	answer := waitFor(context.Background(), h, key, "waiter")
	awaitParked(t, h, key)
	releaseGrant(t, h, holder)
	if a := <-answer; a.status != http.StatusOK {
		t.Fatalf("waiter: %d", a.status)
	}
	if got := store.handedOff(); len(got) != 0 {
		t.Fatalf("handoffs %+v with Handoff off", got)
	}
}
