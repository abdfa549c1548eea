package lockserver_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
)

// lateCancelCtx is a context whose first Err call answers as the context
// was at that instant, then cancels it and waits until its caller has
// returned: the interleaving in which the caller's context ends just
// after the Batcher looked at it.
type lateCancelCtx struct {
	context.Context
	cancel   context.CancelFunc
	returned chan struct{}
	fired    atomic.Bool
}

func (c *lateCancelCtx) Err() error {
	if !c.fired.CompareAndSwap(false, true) {
		return c.Context.Err()
	}
	err := c.Context.Err()
	c.cancel()
	<-c.returned
	return err
}

// TestARepeatWhoseCallerLeftAsItWasRequeuedDoesNotStallTheLane: a repeated
// acquire of a key whose first acquire failed (not held) goes back to the
// queue for the next batch. If its context ends just after the Batcher
// checked it, its caller returns (outcome unknown) while the Batcher puts
// it back in the queue and hands it the lead: nobody is there to take
// the lead, and every later acquire waited until its deadline, for ever
// (found by the adversarial review of group grant). The caller that left
// must never be queued again, and the next acquire is served.
func TestARepeatWhoseCallerLeftAsItWasRequeuedDoesNotStallTheLane(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newGatedStore()
		s.fail["k"] = fmt.Errorf("%w: injected", lockserver.ErrUnavailable)
		b := newBatcher(t, s)
		var wg sync.WaitGroup
		var first, k1, k2 answer
		wg.Go(func() { first.lease, first.err = b.Acquire(t.Context(), "first", "w", time.Minute) })
		synctest.Wait() // in the store, behind the gate
		wg.Go(func() { k1.lease, k1.err = b.Acquire(t.Context(), "k", "w1", time.Minute) })
		synctest.Wait()
		inner, cancel := context.WithCancel(t.Context())
		late := &lateCancelCtx{Context: inner, cancel: cancel, returned: make(chan struct{})}
		wg.Go(func() {
			defer close(late.returned)
			k2.lease, k2.err = b.Acquire(late, "k", "w2", time.Minute)
		})
		synctest.Wait()
		close(s.gate)
		wg.Wait()
		if !errors.Is(k2.err, lockserver.ErrUnavailable) {
			t.Fatalf("the repeat whose context ended: %+v, %v; want ErrUnavailable", k2.lease, k2.err)
		}

		ctx, cancelNext := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancelNext()
		l, err := b.Acquire(ctx, "next", "w3", time.Minute)
		if err != nil {
			t.Fatalf("the next acquire, on an idle Batcher: %v; want granted (the lane was handed to a caller that had left)", err)
		}
		if l.Owner != "w3" {
			t.Fatalf("next: %+v; want held by w3", l)
		}
		if st, _ := s.Inspect(t.Context(), "k"); st.Lease != nil && st.Lease.Owner == "w2" {
			t.Fatalf("key k granted to w2, whose caller had gone: %+v", *st.Lease)
		}
	})
}
