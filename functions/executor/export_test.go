package executor

import "time"

// WithPauseFunc replaces the pause fault's wait (a timer) with f, so that a
// test decides when the paused delivery wakes up instead of sleeping.
func WithPauseFunc(f func(d time.Duration)) Option { return func(x *Executor) { x.pause = f } }
