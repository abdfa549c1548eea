package executor

import (
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
)

// WithPauseFunc replaces the pause fault's wait (a timer) with f, so that a
// test decides when the paused delivery wakes up instead of sleeping.
func WithPauseFunc(f func(d time.Duration)) Option { return func(x *Executor) { x.pause = f } }

// WithBeforeClaim runs f after the grant, before the local lease check
// that precedes the claim, so that a test can let the lease's local
// deadline pass there.
func WithBeforeClaim(f func(*client.Lease)) Option { return func(x *Executor) { x.beforeClaim = f } }
