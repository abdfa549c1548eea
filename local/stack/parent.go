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
// the parent of this process exits: its parent process id changes (the
// kernel hands an orphan to PID 1 or to a subreaper). It also ends when
// ctx ends or cancel is called. interval is the polling period
// (ParentPollInterval unless a test wants faster).
//
// `go run ./local up` needs it: the go command does not forward signals to
// the program it runs. SIGTERM (or SIGKILL, or a closed terminal's SIGHUP)
// kills the go command and leaves its child running under PID 1; with
// WithParent the child notices and stops its stack. SIGINT sent to the go
// command alone is ignored by it (cmd/go waits for the child, expecting
// the terminal to deliver Ctrl-C to the whole process group), so the
// child can neither see it nor act on it; send signals to the child's pid
// or to the process group.
//
// A process whose parent is already gone when WithParent is called (its
// parent is PID 1 from the start) is watched for a change from that
// parent, which never comes. The polling goroutine ends with the returned
// context.
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
