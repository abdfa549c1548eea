package lockserver

// The wait queue: a fair blocking acquire.
//
// An acquire with api.AcquireRequest.WaitMs joins its key's queue on this
// lock-server, behind the waiting acquires of the key that arrived before
// it. Only the head of a queue asks the backend for the key; the others
// wait to become the head. The head asks once when it becomes the head and
// again whenever one of these happens:
//
//   - a release or revoke of the key answered by this lock-server (wake):
//     the next grant follows the release by about one backend round trip
//     (with the handoff, below, a release grants the parked head in the
//     release's own backend call instead);
//   - the holder's lease reaches its ExpiresAt, read with Inspect after
//     each refusal (a timer; a renewal moves it, and the head reads it
//     again after the next refusal);
//   - WaitPoll passes: a release through another lock-server sharing the
//     backend, which this one cannot see, is noticed within WaitPoll.
//
// But a head about to ask while a release of its key answered by this
// lock-server is in flight (releaseAndWake: a holder's release, its
// handoff attempt, or the release of an abandoned grant) does not ask:
// the lease being released may still hold the key, and a refused ask
// costs a backend write and an Inspect. It parks instead (and can be
// claimed by another release's handoff, as any parked head) until that
// release ends, which wakes it whether the release succeeded or failed,
// and then asks; a release still running after WaitPoll lets it ask
// anyway. Not on a store that orders an acquire after a release in
// flight (store.ReleaseOrderer: etcd): there the ask is sent at once and
// usually granted right after the release, the two writes sharing a
// flush.
//
// Every grant is the backend's (LockStore.Acquire through the Batcher and
// the token floor, exactly as a plain acquire, or a release's
// Handoffer.Handoff through the same token floor), so the token is drawn
// as always and every invariant of the store holds; the queue only
// decides which of this lock-server's waiters asks or is handed the key.
//
// Handoff (ServerConfig.Handoff, a store that is a Handoffer). Between
// two asks the head is parked. A release of the key answered by this
// lock-server while the head is parked claims it (under the queue's
// mutex) and makes the release and the head's grant one backend
// transaction (handOff); the outcome is delivered to the head, which
// answers its request with the grant, or, when nothing was granted that
// the backend confirmed (refused, unknown, withdrawn by the floor), asks
// again as usual. A head in the middle of its own ask is never claimed:
// that release releases and wakes it. A head that follows a head granted
// on this lock-server parks at once until that grant's ExpiresAt (at most
// WaitPoll) instead of asking first, so that it is parked, and can be
// handed the key, when the release comes. Across lock-servers there is
// no common queue: FIFO order holds among the waiters of one lock-server,
// and an acquire through another one (or a plain acquire, which never
// queues) can take the key between two of them (barging).
//
// A waiter whose request ends (cancelled, its wait or budget over) leaves
// the queue and is never asked for. The head's backend call runs on a
// context detached from the request (bounded by RequestTimeout), so its
// outcome is always known: if the key was granted but the request has
// ended meanwhile, the grant is released at once (conditional on its
// token, so it can end nothing else) and the next waiter is woken; if that
// release fails, the lease expires after its TTL. A grant whose answer is
// lost after it was written (the connection drops) is an orphan until its
// TTL, as for any acquire.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// Log events of the wait queue.
const (
	// EventAcquireQueued (debug): an acquire joined its key's wait queue,
	// with the number of waiters ahead of it.
	EventAcquireQueued = "acquire_queued"
	// EventWaitGrantAbandoned: a waiter's request ended while its grant
	// was in flight; the grant was released and the next waiter woken.
	EventWaitGrantAbandoned = "wait_grant_abandoned"
	// EventHandoffFailed (debug): a handoff to a parked waiter did not
	// grant it the key. Refused (the release was): the waiter sleeps on
	// until its sleep was to end (resumeSleep true); outcome unknown,
	// withdrawn by the token floor, or refused by the restore guard: it
	// asks again.
	EventHandoffFailed = "handoff_failed"
	// EventWaitReleaseFailed: releasing an abandoned grant failed; the
	// lease expires after its TTL and nobody holds it meanwhile.
	EventWaitReleaseFailed = "wait_release_failed"
)

// Defaults and bounds of the wait queue's ServerConfig fields.
const (
	// DefaultMaxWaiters is ServerConfig.MaxWaiters' default: half of the
	// default MaxInFlight (waiters hold their in-flight slot while they
	// wait; the other half stays free for releases and renewals).
	DefaultMaxWaiters = 128
	// DefaultWaitPoll is ServerConfig.WaitPoll's default: how late a head
	// waiter may notice a release made through another lock-server.
	DefaultWaitPoll = 250 * time.Millisecond
	// MaxWaitPoll caps ServerConfig.WaitPoll.
	MaxWaitPoll = 10 * time.Second
	// minRetry is the first pause of a head after an ask refused although
	// the lease's ExpiresAt had passed by lock-server's clock (it had not
	// by the backend's); it doubles with each such refusal in a row, up to
	// WaitPoll.
	minRetry = 2 * time.Millisecond
)

// errQueueFull is returned by join when MaxWaiters waiters wait already.
var errQueueFull = errors.New("lockserver: wait queue full")

// waitQueues are the queues of every key with waiters on this Server.
type waitQueues struct {
	mu   sync.Mutex
	keys map[string]*keyQueue
	n    int // waiters over all keys
	max  int
	log  *slog.Logger
	// releasing counts, per key, the releases answered here whose backend
	// call is in flight (releaseAndWake); a key leaves the map when its
	// last release ends.
	releasing map[string]int
}

// keyQueue is one key's waiters, head first.
type keyQueue struct {
	waiters []*waiter
	// wake has room for one signal: a release or revoke of the key seen
	// since the head last looked. A stale signal costs one extra ask.
	wake chan struct{}
	// held (under waitQueues.mu) is the lease the last head left with,
	// when it left granted: the next head knows the key is held until
	// held.ExpiresAt without asking. Used only when releases hand off.
	held store.Lease
}

// waiter is one waiting acquire.
type waiter struct {
	// head is closed when the waiter becomes the head of its queue.
	head chan struct{}
	// to is the grant the waiter asks for: what a handoff grants it.
	to store.AcquireRequest
	// parked (under waitQueues.mu): the waiter is the head and sleeps
	// between two asks; only a parked head can be claimed for a handoff.
	parked bool
	// claimed (under waitQueues.mu): a release has claimed the waiter for
	// a handoff and its outcome is not yet consumed; the waiter does not
	// ask the backend, nor leave, until it has read handed.
	claimed bool
	// handed carries the outcome of the one handoff in flight for the
	// waiter (room for one: a waiter is claimed at most once at a time).
	handed chan handoffResult
	// afterRelease (under waitQueues.mu): the head parks until a release
	// of its key in flight here ends; the end of every such release wakes
	// it, whatever its outcome. Cleared by unpark.
	afterRelease bool
}

// handoffResult is the outcome of a handoff to a waiter: the lease (err
// nil: the backend confirmed the grant) or why the waiter has none and
// must ask again; asked is when the handoff was sent.
type handoffResult struct {
	lease store.Lease
	err   error
	asked time.Time
}

func newWaitQueues(max int, log *slog.Logger) *waitQueues {
	return &waitQueues{keys: make(map[string]*keyQueue), max: max, log: log, releasing: make(map[string]int)}
}

// join queues a waiter for key at the tail and returns it with its key's
// queue, or errQueueFull. The acquire_queued event is logged before the
// queue is unlocked, so that it is in the order of the joins.
func (q *waitQueues) join(ctx context.Context, key, owner string, ttl time.Duration) (*waiter, *keyQueue, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n >= q.max {
		return nil, nil, errQueueFull
	}
	kq := q.keys[key]
	if kq == nil {
		kq = &keyQueue{wake: make(chan struct{}, 1)}
		q.keys[key] = kq
	}
	w := &waiter{head: make(chan struct{}), to: store.AcquireRequest{Key: key, Owner: owner, TTL: ttl}, handed: make(chan handoffResult, 1)}
	kq.waiters = append(kq.waiters, w)
	if len(kq.waiters) == 1 {
		close(w.head)
	}
	q.n++
	q.log.DebugContext(ctx, "acquire queued", "event", EventAcquireQueued, "key", key, "owner", owner, "ahead", len(kq.waiters)-1)
	return w, kq, nil
}

// leave takes w out of key's queue; if w was the head, the next waiter
// becomes the head, and granted (the lease w leaves with; zero when it
// has none) is kept as the key's held hint for it.
func (q *waitQueues) leave(key string, w *waiter, granted store.Lease) {
	q.mu.Lock()
	defer q.mu.Unlock()
	kq := q.keys[key]
	if kq == nil {
		return
	}
	for i, x := range kq.waiters {
		if x != w {
			continue
		}
		kq.waiters = append(kq.waiters[:i], kq.waiters[i+1:]...)
		q.n--
		if i == 0 && len(kq.waiters) > 0 {
			kq.held = granted
			close(kq.waiters[0].head)
		}
		break
	}
	if len(kq.waiters) == 0 {
		delete(q.keys, key)
	}
}

// wake tells key's head, if any, that the key may be free.
func (q *waitQueues) wake(key string) {
	q.mu.Lock()
	kq := q.keys[key]
	q.mu.Unlock()
	if kq != nil {
		kq.signal()
	}
}

// signal leaves a wake for kq's head; it never blocks.
func (kq *keyQueue) signal() {
	select {
	case kq.wake <- struct{}{}:
	default:
	}
}

// releaseStarted counts a release of key about to call the backend.
// Every call is followed by one call of releaseEnded.
func (q *waitQueues) releaseStarted(key string) {
	q.mu.Lock()
	q.releasing[key]++
	q.mu.Unlock()
}

// releaseEnded counts the end of a release of key and wakes the key's
// head when the release freed the key (released) or when the head parked
// until it ended (awaitRelease).
func (q *waitQueues) releaseEnded(key string, released bool) {
	q.mu.Lock()
	if q.releasing[key]--; q.releasing[key] <= 0 {
		delete(q.releasing, key)
	}
	kq := q.keys[key] // nil, or it has a head
	wake := kq != nil && (released || kq.waiters[0].afterRelease)
	q.mu.Unlock()
	if wake {
		kq.signal()
	}
}

// awaitRelease reports whether a release of the key of w, the head, is
// in flight here: w's ask would then only be refused, so it parks
// instead, and is marked so that the end of that release, whatever its
// outcome, wakes it.
func (q *waitQueues) awaitRelease(w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	w.afterRelease = q.releasing[w.to.Key] > 0
	return w.afterRelease
}

// claim returns key's head waiter, marked claimed, if it is parked and
// not already claimed; nil otherwise (no waiter, or the head is asking the
// backend itself: the releaser then releases and wakes it as usual). The
// caller must deliver exactly one handoffResult to the waiter it got.
func (q *waitQueues) claim(key string) *waiter {
	q.mu.Lock()
	defer q.mu.Unlock()
	kq := q.keys[key]
	if kq == nil || len(kq.waiters) == 0 {
		return nil
	}
	w := kq.waiters[0]
	if !w.parked || w.claimed {
		return nil
	}
	w.claimed = true
	return w
}

// heldHint returns the lease the previous head of kq left with (zero:
// none, or it left without a grant) and forgets it.
func (q *waitQueues) heldHint(kq *keyQueue) store.Lease {
	q.mu.Lock()
	defer q.mu.Unlock()
	l := kq.held
	kq.held = store.Lease{}
	return l
}

// deliver hands r to w, claimed by claim; it never blocks.
func (w *waiter) deliver(r handoffResult) { w.handed <- r }

// park marks the head w as sleeping between asks: claimable.
func (q *waitQueues) park(w *waiter) {
	q.mu.Lock()
	w.parked = true
	q.mu.Unlock()
}

// unpark ends w's sleep. got says whether w has already received a
// handoff's outcome; if it has not but a handoff is in flight for it,
// unpark waits for that outcome and returns it (ok true). Once unpark
// returns, w is neither parked nor claimed: nobody hands it a grant
// while it asks the backend itself.
func (q *waitQueues) unpark(w *waiter, got bool) (r handoffResult, ok bool) {
	q.mu.Lock()
	w.parked, w.afterRelease = false, false
	if !w.claimed || got {
		w.claimed = false
		q.mu.Unlock()
		return handoffResult{}, false
	}
	q.mu.Unlock()
	// A handoff is in flight: its outcome comes within the releaser's
	// backend timeout.
	r = <-w.handed
	q.mu.Lock()
	w.claimed = false
	q.mu.Unlock()
	return r, true
}

// waiting returns the number of waiters over all keys.
func (q *waitQueues) waiting() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// acquireWaiting serves an acquire with a wait: it queues for key, and as
// the head asks the backend until it is granted, its request ends, or
// waitEnd passes (ErrLockHeld). waited is the time from start to the
// backend call that granted the key; by is the granting path, as for
// grant, or GrantedByHandoff.
func (s *Server) acquireWaiting(reqCtx context.Context, key, owner string, ttl time.Duration, start, waitEnd, budgetEnd time.Time) (l store.Lease, by string, waited time.Duration, err error) {
	w, kq, err := s.waitq.join(reqCtx, key, owner, ttl)
	if errors.Is(err, errQueueFull) {
		// No place to wait: one ask, as a plain acquire.
		l, by, err := s.grant(reqCtx, key, owner, ttl, budgetEnd)
		return l, by, 0, err
	}
	defer func() { s.waitq.leave(key, w, l) }() // l: the named result
	waitCtx, cancel := context.WithDeadline(reqCtx, waitEnd)
	defer cancel()
	select {
	case <-w.head:
	case <-waitCtx.Done():
		return store.Lease{}, "", 0, s.waitOver(reqCtx, key, start, "before its turn came")
	}
	// With handoff, a head that follows a granted head parks at once
	// until that grant's ExpiresAt (at most WaitPoll): the key is held by
	// the waiter just answered, so asking would only be refused, and a
	// head in the middle of an ask when the release comes cannot be
	// handed the key.
	var held store.Lease
	if s.handoffOn() {
		held = s.waitq.heldHint(kq)
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	early := 0 // asks in a row refused after the lease's ExpiresAt
	// askBy: when the head asks even if releases of its key are in flight
	// here, WaitPoll after its last ask (or its first park for one), so
	// that releases that hang or follow one another delay it by WaitPoll
	// at most.
	var askBy time.Time
	// resume, after a refused handoff, is when the interrupted sleep was
	// to end: the refusal changed nothing in the backend, so what the
	// head knew when it parked still holds, and it parks again until then
	// instead of asking.
	var resume time.Time
	for {
		// The request may have ended while it became the head or slept.
		if waitCtx.Err() != nil {
			return store.Lease{}, "", 0, s.waitOver(reqCtx, key, start, "at the head of the queue")
		}
		pause := s.cfg.WaitPoll
		afterRelease := false
		if until := time.Until(resume); until > 0 {
			pause = until
		} else if until := time.Until(held.ExpiresAt); held.Token != 0 && until > 0 {
			pause = min(pause, until)
		} else if !s.askDuringRelease && (askBy.IsZero() || time.Now().Before(askBy)) && s.waitq.awaitRelease(w) {
			// A release of the key is in flight here, and its lease may
			// still hold the key. The head parks until the release ends,
			// at most until askBy.
			if askBy.IsZero() {
				askBy = time.Now().Add(pause)
			}
			pause = time.Until(askBy)
			afterRelease = true
		} else {
			asked := time.Now()
			askBy = asked.Add(s.cfg.WaitPoll)
			l, by, err := s.grant(context.WithoutCancel(reqCtx), key, owner, ttl, budgetEnd)
			if err == nil {
				if reqCtx.Err() != nil {
					s.abandon(reqCtx, l)
					return store.Lease{}, "", 0, fmt.Errorf("%w: the request ended while its grant was in flight; the grant was released", store.ErrUnavailable)
				}
				return l, by, asked.Sub(start), nil
			}
			if !errors.Is(err, store.ErrLockHeld) {
				return store.Lease{}, "", 0, err
			}
			ictx, icancel := context.WithTimeout(context.WithoutCancel(reqCtx), s.callTimeout(reqCtx))
			st, ierr := s.store.Inspect(ictx, key)
			icancel()
			switch {
			case ierr != nil:
			case st.Lease == nil || !time.Now().Before(st.Lease.ExpiresAt):
				// Free, or expired by this clock but not by the backend's (a
				// clock behind ours, etcd's remaining TTL in whole seconds):
				// ask again soon, backing off so that a skew costs a few asks.
				pause = min(pause, minRetry<<min(early, 10))
				early++
			default:
				pause = min(pause, time.Until(st.Lease.ExpiresAt))
				early = 0
			}
		}
		held, resume = store.Lease{}, time.Time{}
		sleepEnd := time.Now().Add(pause)
		r, got, woken := s.sleep(w, kq, waitCtx, timer, pause)
		if !got {
			continue
		}
		if r.err != nil {
			// Nothing was granted to this waiter that the backend
			// confirmed. A refused release (a stale token, a lease that
			// had ended or another owner's) changed nothing, so the head
			// sleeps on, parked, until its sleep was to end: asking now
			// would only be refused, and a head in the middle of an ask
			// when the real release comes cannot be handed the key. The
			// head then notices a release as it would have without the
			// refused one: through this lock-server at once, through
			// another within WaitPoll. Unless it was woken in the same
			// sleep (a real release came while the refused handoff was in
			// flight, and found the head claimed): then, as after an
			// unknown outcome, a grant the floor withdrew or a restore, it
			// asks again.
			// A head parked for a release in flight knew nothing more:
			// it looks again.
			if (errors.Is(r.err, store.ErrStaleToken) || errors.Is(r.err, store.ErrNotHeld)) && !woken && !afterRelease {
				resume = sleepEnd
			}
			s.log.DebugContext(reqCtx, "handoff to a waiter failed", "event", EventHandoffFailed, "key", key, "owner", owner, "error", r.err.Error(), "resumeSleep", !resume.IsZero())
			continue
		}
		if reqCtx.Err() != nil {
			s.abandon(reqCtx, r.lease)
			return store.Lease{}, "", 0, fmt.Errorf("%w: the request ended while a handoff to it was in flight; the grant was released", store.ErrUnavailable)
		}
		return r.lease, GrantedByHandoff, r.asked.Sub(start), nil
	}
}

// sleep parks the head w for pause, until its key is woken, or its wait
// ends, or a release hands it the key. got says whether a handoff's
// outcome came (r), woken whether a wake was taken (a release or revoke
// of the key answered here; both can be true when the wake came while a
// handoff to w was in flight); once sleep returns, w is neither parked
// nor claimed.
func (s *Server) sleep(w *waiter, kq *keyQueue, waitCtx context.Context, timer *time.Timer, pause time.Duration) (r handoffResult, got, woken bool) {
	timer.Reset(pause)
	s.waitq.park(w)
	select {
	case <-kq.wake:
		woken = true
	case <-timer.C:
	case <-waitCtx.Done():
	case r = <-w.handed:
		got = true
	}
	if hr, ok := s.waitq.unpark(w, got); ok {
		r, got = hr, true
	}
	return r, got, woken
}

// handoffOn reports whether releases hand off to parked waiters: the
// store can (Handoffer) and ServerConfig.Handoff is on.
func (s *Server) handoffOn() bool { return s.handoffer != nil && s.cfg.Handoff }

// handOff serves the release of from when this lock-server has a parked
// head waiter for its key and the store can hand off: one backend
// transaction releases from and grants the key to the waiter (Handoffer).
// handled is false when there is no such waiter or no capability: the
// caller then releases and wakes as usual. Otherwise err is the release's
// answer: nil when from was released (the waiter has its grant, or, when
// the token floor withdrew the grant, asks again), the store's refusal
// (ErrStaleToken, ErrNotHeld: nothing changed, the waiter stays queued
// and sleeps on, parked, until its sleep was to end), or ErrUnavailable
// (outcome unknown: the waiter is told nothing was granted and asks
// again; a grant that was in fact made is nobody's and expires after the
// waiter's TTL). When the
// restore guard refuses the grant (ErrBackendRestored, nothing changed),
// from is released by a plain Release: the guard refuses grants, never
// releases, and the waiter hears the refusal from its own ask. (On etcd,
// when the store learned of the restore only after the transaction, from
// has ended already and that Release answers ErrNotHeld or
// ErrStaleToken, which is the truth.)
func (s *Server) handOff(ctx context.Context, from store.LeaseRef) (handled bool, err error) {
	if !s.handoffOn() {
		return false, nil
	}
	w := s.waitq.claim(from.Key)
	if w == nil {
		return false, nil
	}
	floor := s.issued.Load() // before the request: see floor.go
	asked := time.Now()
	l, err := s.handoffer.Handoff(ctx, from, w.to)
	s.observe(ctx, err)
	switch {
	case err == nil && l.Token <= floor:
		s.countHandoff("withdrawn")
		w.deliver(handoffResult{err: s.withdraw(ctx, l, floor)})
		return true, nil
	case err == nil:
		s.countHandoff("granted")
		s.noteIssued(l.Token)
		w.deliver(handoffResult{lease: l, asked: asked})
		return true, nil
	case errors.Is(err, store.ErrBackendRestored):
		s.countHandoff("restored")
		w.deliver(handoffResult{err: err})
		err = s.store.Release(ctx, from.Key, from.Owner, from.Token)
		s.observe(ctx, err)
		if err == nil {
			s.waitq.wake(from.Key)
		}
		return true, err
	default:
		if _, code := statusOf(err); code == api.CodeBackendUnavailable || code == api.CodeInternal {
			s.countHandoff("unknown")
		} else {
			s.countHandoff("refused")
		}
		w.deliver(handoffResult{err: err})
		return true, err
	}
}

// countHandoff counts one handoff with outcome in lockserver_handoffs_total.
func (s *Server) countHandoff(outcome string) {
	if s.handoffs != nil {
		s.handoffs.WithLabelValues(outcome).Inc()
	}
}

// waitOver is the refusal of a waiter whose wait ended without a grant.
func (s *Server) waitOver(reqCtx context.Context, key string, start time.Time, where string) error {
	if err := reqCtx.Err(); err != nil {
		return fmt.Errorf("%w: the request ended while waiting for %q: %v", store.ErrUnavailable, key, err)
	}
	return fmt.Errorf("%w: still held after waiting %d ms %s", store.ErrLockHeld, time.Since(start).Milliseconds(), where)
}

// abandon releases l, granted to a waiter whose request has ended, and
// wakes the next waiter. If the release fails, l expires after its TTL.
func (s *Server) abandon(reqCtx context.Context, l store.Lease) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(reqCtx), s.cfg.RequestTimeout)
	defer cancel()
	if err := s.store.Release(ctx, l.Key, l.Owner, l.Token); err != nil {
		s.log.WarnContext(ctx, "releasing a grant whose waiter had gone failed; it expires after its TTL",
			"event", EventWaitReleaseFailed, "key", l.Key, "owner", l.Owner, "token", l.Token, "error", err.Error())
		return
	}
	s.log.InfoContext(ctx, "grant released: its waiter had gone", "event", EventWaitGrantAbandoned, "key", l.Key, "owner", l.Owner, "token", l.Token)
	s.waitq.wake(l.Key)
}
