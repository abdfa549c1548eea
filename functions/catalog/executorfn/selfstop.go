package executorfn

import (
	"context"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"syscall"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
)

// selfStop returns hooks that stop this process with SIGSTOP once, before
// the rail submission of payout target (the fencing experiment's worker,
// armed by executor.EnvSelfStopBeforeSubmit).
func selfStop(target string, log *slog.Logger) executor.Hooks {
	var once sync.Once
	log.Warn("experiment hook armed: this worker will SIGSTOP itself before the rail submission", "event", executor.EventSelfStopArmed, "payoutId", target)
	return executor.Hooks{BeforeRailSubmit: func(_ context.Context, e payoutevent.Event, token int64) {
		if e.PayoutID != target {
			return
		}
		once.Do(func() {
			log.Warn("stopping self before the rail submission", "event", executor.EventSelfStop, "payoutId", e.PayoutID, "accountId", e.AccountID, "token", token, "pid", os.Getpid())
			// SIGSTOP sent to the process may be taken by another thread while
			// this one runs on for a moment, long enough to reach the rail.
			// Sent to this very thread, it stops the process before Tgkill
			// returns.
			runtime.LockOSThread()
			_ = syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
			runtime.UnlockOSThread()
			log.Warn("resumed after SIGCONT; carrying on as if the lease were still held", "event", executor.EventSelfResumed, "payoutId", e.PayoutID, "token", token)
		})
	}}
}
