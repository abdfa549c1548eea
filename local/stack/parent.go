package stack

import (
	"context"
	"errors"
	"os"
	"time"
)

// ErrParentGone is the cause (context.Cause) of a context of WithParent
// that ended because the parent process exited.
var ErrParentGone = errors.New("stack: the parent process exited")

// ParentPollInterval is how often WithParent checks the parent process:
// a stack notices a dead parent within this time.
const ParentPollInterval = 100 * time.Millisecond

// WithParent returns a context that ends, with cause ErrParentGone, when
// the parent of this process exits (its parent process id changes), when
// ctx ends, or when cancel is called; interval is the polling period
// (ParentPollInterval unless a test wants faster). `go run ./local up`
// needs it: the go command forwards no signal, and when it is killed its
// child is left running under PID 1. A process whose parent is already PID
// 1 when it is called is never told. The polling goroutine ends with the
// returned context.
func WithParent(ctx context.Context, interval time.Duration) (context.Context, context.CancelFunc) {
	parent := os.Getppid()
	ctx, cancel := context.WithCancelCause(ctx)
	// Ends when ctx ends: on cancel, on the caller's ctx, or below.
	go func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if os.Getppid() != parent {
					cancel(ErrParentGone)
					return
				}
			}
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}
