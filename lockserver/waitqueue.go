package lockserver

// The wait queue: a fair blocking acquire (issue 16, target 3).
//
// An acquire with api.AcquireRequest.WaitMs joins its key's queue on this
// lock-server, behind the waiting acquires of the key that arrived before
// it. Only the head of a queue asks the backend for the key; the others
// wait to become the head. The head asks once when it becomes the head and
// again whenever one of these happens:
//
//   - a release or revoke of the key answered by this lock-server (wake):
//     the next grant follows the release by about one backend round trip;
//   - the holder's lease reaches its ExpiresAt, read with Inspect after
//     each refusal (a timer; a renewal moves it, and the head reads it
//     again after the next refusal);
//   - WaitPoll passes: a release through another lock-server sharing the
//     backend, which this one cannot see, is noticed within WaitPoll.
//
// Every grant is the backend's (LockStore.Acquire through the Batcher and
// the token floor, exactly as a plain acquire), so the token is drawn as
// always and every invariant of the store holds; the queue only decides
// which of this lock-server's waiters asks. Across lock-servers there is
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
)

// Log events of the wait queue.
const (
	// EventAcquireQueued (debug): an acquire joined its key's wait queue,
	// with the number of waiters ahead of it.
	EventAcquireQueued = "acquire_queued"
	// EventWaitGrantAbandoned: a waiter's request ended while its grant
	// was in flight; the grant was released and the next waiter woken.
	EventWaitGrantAbandoned = "wait_grant_abandoned"
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
}

// keyQueue is one key's waiters, head first.
type keyQueue struct {
	waiters []*waiter
	// wake has room for one signal: a release or revoke of the key seen
	// since the head last looked. A stale signal costs one extra ask.
	wake chan struct{}
}

// waiter is one waiting acquire.
type waiter struct {
	// head is closed when the waiter becomes the head of its queue.
	head chan struct{}
}

func newWaitQueues(max int, log *slog.Logger) *waitQueues {
	return &waitQueues{keys: make(map[string]*keyQueue), max: max, log: log}
}

// join queues a waiter for key at the tail and returns it with its key's
// queue, or errQueueFull. The acquire_queued event is logged before the
// queue is unlocked, so that it is in the order of the joins.
func (q *waitQueues) join(ctx context.Context, key, owner string) (*waiter, *keyQueue, error) {
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
	w := &waiter{head: make(chan struct{})}
	kq.waiters = append(kq.waiters, w)
	if len(kq.waiters) == 1 {
		close(w.head)
	}
	q.n++
	q.log.DebugContext(ctx, "acquire queued", "event", EventAcquireQueued, "key", key, "owner", owner, "ahead", len(kq.waiters)-1)
	return w, kq, nil
}

// leave takes w out of key's queue; if w was the head, the next waiter
// becomes the head.
func (q *waitQueues) leave(key string, w *waiter) {
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
	if kq == nil {
		return
	}
	select {
	case kq.wake <- struct{}{}:
	default:
	}
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
// backend call that granted the key.
func (s *Server) acquireWaiting(reqCtx context.Context, key, owner string, ttl time.Duration, start, waitEnd, budgetEnd time.Time) (l Lease, waited time.Duration, err error) {
	w, kq, err := s.waitq.join(reqCtx, key, owner)
	if errors.Is(err, errQueueFull) {
		// No place to wait: one ask, as a plain acquire.
		l, err := s.grant(reqCtx, key, owner, ttl, budgetEnd)
		return l, 0, err
	}
	defer s.waitq.leave(key, w)
	waitCtx, cancel := context.WithDeadline(reqCtx, waitEnd)
	defer cancel()
	select {
	case <-w.head:
	case <-waitCtx.Done():
		return Lease{}, 0, s.waitOver(reqCtx, key, start, "before its turn came")
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	early := 0 // asks in a row refused after the lease's ExpiresAt
	for {
		// The request may have ended while it became the head or slept.
		if waitCtx.Err() != nil {
			return Lease{}, 0, s.waitOver(reqCtx, key, start, "at the head of the queue")
		}
		asked := time.Now()
		l, err := s.grant(context.WithoutCancel(reqCtx), key, owner, ttl, budgetEnd)
		if err == nil {
			if reqCtx.Err() != nil {
				s.abandon(reqCtx, l)
				return Lease{}, 0, fmt.Errorf("%w: the request ended while its grant was in flight; the grant was released", ErrUnavailable)
			}
			return l, asked.Sub(start), nil
		}
		if !errors.Is(err, ErrLockHeld) {
			return Lease{}, 0, err
		}
		pause := s.cfg.WaitPoll
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
		timer.Reset(pause)
		select {
		case <-kq.wake:
		case <-timer.C:
		case <-waitCtx.Done():
		}
	}
}

// waitOver is the refusal of a waiter whose wait ended without a grant.
func (s *Server) waitOver(reqCtx context.Context, key string, start time.Time, where string) error {
	if err := reqCtx.Err(); err != nil {
		return fmt.Errorf("%w: the request ended while waiting for %q: %v", ErrUnavailable, key, err)
	}
	return fmt.Errorf("%w: still held after waiting %d ms %s", ErrLockHeld, time.Since(start).Milliseconds(), where)
}

// abandon releases l, granted to a waiter whose request has ended, and
// wakes the next waiter. If the release fails, l expires after its TTL.
func (s *Server) abandon(reqCtx context.Context, l Lease) {
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
