// Command executor is the payout worker as a process (package
// functions/executor): it accepts Pub/Sub push requests on $PORT and
// executes each payout under a lease. Configuration is read from the
// environment (docs/configuration.md).
//
// For the fencing experiment only: EXECUTOR_SELF_STOP_BEFORE_SUBMIT set to
// a payout id makes the process send itself SIGSTOP, once, right after its
// last lease check and before the rail submission of that payout, so that
// the harness can let the lease expire and resume it with SIGCONT.
package main

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/serve"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/idtokens"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
)

func main() {
	serve.Main("executor", envNames(), func(ctx context.Context, getenv func(string) string, log *slog.Logger) (http.Handler, func(), error) {
		cfg, err := executor.LoadConfig(getenv)
		if err != nil {
			return nil, nil, err
		}
		var opts []executor.Option
		if on, err := idtokens.Enabled(executor.EnvIDTokens, getenv(executor.EnvIDTokens)); err != nil {
			return nil, nil, err
		} else if on {
			// Cloud Run: payment-resource and rail-proxy are private services.
			tr, err := idtokens.New(ctx, nil, nil, cfg.PaymentResourceURL, cfg.RailProxyURL)
			if err != nil {
				return nil, nil, err
			}
			// The span (and traceparent) outside, the ID token inside.
			opts = append(opts, executor.WithHTTPClient(&http.Client{Transport: tracing.Transport(tr)}))
		}
		if target := getenv(executor.EnvSelfStopBeforeSubmit); target != "" {
			opts = append(opts, executor.WithHooks(selfStop(target, log)))
		}
		x, err := executor.New(cfg, log, opts...)
		if err != nil {
			return nil, nil, err
		}
		// After the drain: wait for the lease releases still in flight
		// (each is sent after its push was answered), within what is left
		// of Cloud Run's grace; a release cut short leaves its lease to
		// its TTL, as a crash would.
		closeFn := func() {
			cctx, cancel := context.WithTimeout(context.Background(), releaseDrain)
			defer cancel()
			if err := x.Close(cctx); err != nil {
				log.Warn("lease releases unfinished at stop; their leases end by their TTL", "event", executor.EventReleasesUnfinished, "error", err.Error())
			}
		}
		return x, closeFn, nil
	}, executor.Collectors()...)
}

// releaseDrain bounds the wait for the lease releases in flight at stop:
// httpserve's drain takes up to 8 s of Cloud Run's 10 s grace.
const releaseDrain = time.Second

// selfStop returns hooks that stop this process with SIGSTOP once, before
// the rail submission of payout target.
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

// envNames lists the environment variables executor reads (its config's
// constants), for the unknown-variable warning at start.
func envNames() []string {
	return append(executor.EnvNames(), executor.EnvSelfStopBeforeSubmit, executor.EnvIDTokens)
}
