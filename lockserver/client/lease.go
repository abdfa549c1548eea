package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
)

// Lease is a granted lease on one key, held by this process until its local
// deadline passes, a renewal is refused, or it is released. It is safe for
// concurrent use.
//
// Before every side effect made under the lease, call Check (or Held), or
// better Renew, which asks the server: Check reads only the local
// deadline, so it cannot see an operator's revoke or an expiry the server
// decided early, while a Renew answered before the side effect stops the
// holder for both (the window left is one round trip). Then send Token to
// the resource, which must refuse it if it has seen a larger one. These
// checks narrow the window in which a stale holder writes; only the
// resource's check closes it.
type Lease struct {
	c     *Client
	key   string
	owner string
	token int64

	mu       sync.Mutex
	grant    api.Grant
	deadline time.Time
	timer    Timer
	err      error // non-nil once lost; wraps ErrLeaseLost
	done     chan struct{}
	released bool

	stopRenew chan struct{} // closed to end the renewal goroutine
	renewing  sync.WaitGroup
}

func newLease(c *Client, g api.Grant, sent time.Time) *Lease {
	l := &Lease{
		c: c, key: g.Key, owner: g.Owner, token: g.Token,
		grant: g, done: make(chan struct{}), stopRenew: make(chan struct{}),
	}
	l.deadline = sent.Add(c.usable(time.Duration(g.TTLMs) * time.Millisecond))
	l.mu.Lock()
	l.armLocked()
	l.mu.Unlock()
	return l
}

// armLocked schedules onDeadline at the current deadline. l.mu is held.
func (l *Lease) armLocked() {
	d := l.deadline.Sub(l.c.clock.Now())
	l.timer = l.c.clock.AfterFunc(max(d, 0), l.onDeadline)
}

// onDeadline runs when the deadline timer fires. A renewal may have moved the
// deadline since the timer was set; then it re-arms instead of losing.
func (l *Lease) onDeadline() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return
	}
	if l.c.clock.Now().Before(l.deadline) {
		l.armLocked()
		return
	}
	l.loseLocked(ErrDeadlinePassed)
}

// loseLocked marks the lease lost with cause and closes Done. l.mu is held.
func (l *Lease) loseLocked(cause error) {
	if l.err != nil {
		return
	}
	l.err = fmt.Errorf("%w: %q token %d: %w", ErrLeaseLost, l.key, l.token, cause)
	if l.timer != nil {
		l.timer.Stop()
	}
	close(l.done)
}

// Key returns the lock key.
func (l *Lease) Key() string { return l.key }

// Owner returns the owner id the lease was granted to.
func (l *Lease) Owner() string { return l.owner }

// Token returns the fencing token of this grant: present it to every fence
// point with each write.
func (l *Lease) Token() int64 { return l.token }

// Proof returns the grant's proof (api.Grant.Proof, from the latest
// answer), "" when lock-server signs none. Send it with the token to fence
// points that verify tokens; it is opaque to the holder.
func (l *Lease) Proof() string { return l.Grant().Proof }

// Grant returns the server's latest answer for this lease (from the acquire
// or the last successful renewal).
func (l *Lease) Grant() api.Grant {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.grant
}

// Deadline returns the local instant, on the Client's clock, after which the
// lease is no longer reported held. It moves later with each renewal.
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Done returns a channel closed when the lease is lost: the deadline passed,
// a renewal was refused, or it was released. It is never reopened.
func (l *Lease) Done() <-chan struct{} { return l.done }

// Err returns nil while the lease is held, and afterwards an error wrapping
// ErrLeaseLost and its cause (ErrDeadlinePassed, ErrReleased, ErrNotHeld,
// ErrStaleToken). Like Check, which it is, it reads the clock itself: a
// deadline that has passed is reported even if the timer that marks it has
// not fired yet.
func (l *Lease) Err() error { return l.Check() }

// Check returns nil if the lease is held now by the local clock, and the
// reason it is not otherwise. It reads the clock itself, so it is right even
// if the deadline timer has not fired yet.
func (l *Lease) Check() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil && !l.c.clock.Now().Before(l.deadline) {
		l.loseLocked(ErrDeadlinePassed)
	}
	return l.err
}

// Held reports whether Check would return nil.
func (l *Lease) Held() bool { return l.Check() == nil }

// Renew asks the server to extend the lease by its TTL and moves the local
// deadline to (send time + TTL - drift allowance). A refusal (ErrNotHeld,
// ErrStaleToken) loses the lease; a transport failure (ErrUnavailable) does
// not, and the caller may retry until the deadline. Renewing a lost lease
// returns its Err without a request.
func (l *Lease) Renew(ctx context.Context) error {
	if err := l.Check(); err != nil {
		return err
	}
	sent := l.c.clock.Now()
	g, err := l.c.RenewLease(ctx, l.key, l.owner, l.token)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case errors.Is(err, ErrBadAnswer):
		// RenewLease refuses a grant of another key, owner or token: what
		// the server extended is unknown, so the lease is not trusted.
		l.loseLocked(err)
	case err == nil:
		if l.err != nil {
			// The deadline passed while the request was in flight. The server
			// extended a lease the holder has already given up on; it expires
			// by itself, and a lost handle is never resurrected.
			return l.err
		}
		l.grant = g
		if d := sent.Add(l.c.usable(time.Duration(g.TTLMs) * time.Millisecond)); d.After(l.deadline) {
			l.deadline = d
		}
		return nil
	case errors.Is(err, ErrNotHeld), errors.Is(err, ErrStaleToken):
		l.loseLocked(err)
	default:
		return err
	}
	return l.err
}

// Release stops automatic renewal, asks the server to end the lease, and
// marks the handle lost with ErrReleased whatever the answer. The server's
// refusal (ErrNotHeld when the lease had already ended, ErrStaleToken when a
// newer holder exists) is returned for information; a newer holder's lease
// is never touched. A second Release returns nil without a request.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return nil
	}
	l.released = true
	close(l.stopRenew)
	l.mu.Unlock()
	l.renewing.Wait()

	err := l.c.ReleaseLease(ctx, l.key, l.owner, l.token)
	l.mu.Lock()
	l.loseLocked(ErrReleased)
	l.mu.Unlock()
	return err
}

// startRenewing runs the renewal goroutine. It exits when the lease is lost
// (Done) or released (stopRenew); Release waits for it. Its renewals carry
// the values of acquired, the Acquire call's context (a trace context,
// say), without its deadline or cancellation.
func (l *Lease) startRenewing(acquired context.Context, every time.Duration) {
	l.renewing.Add(1)
	go func() {
		defer l.renewing.Done()
		ctx, cancel := context.WithCancel(context.WithoutCancel(acquired))
		defer cancel()
		go func() {
			select {
			case <-l.stopRenew:
			case <-l.done:
			}
			cancel()
		}()
		wait := every
		for {
			if l.c.wait(ctx, wait) != nil {
				return
			}
			err := l.Renew(ctx)
			switch {
			case err == nil:
				wait = every
			case errors.Is(err, ErrLeaseLost) || ctx.Err() != nil:
				return
			default:
				// Transient: try again soon, but keep trying only while the
				// deadline has not passed (Renew checks it).
				wait = max(every/4, time.Millisecond)
			}
		}
	}()
}
