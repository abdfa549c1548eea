package explore

import (
	"context"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/reconciler"
)

// replicaOf is the lock-server replica holder h talks to: executor i the
// replica i mod the number of replicas, the reconciler the next after the
// executors' first (the second of two), an unscheduled actor (-1) the
// first.
func (r *run) replicaOf(h int) int {
	if h < 0 {
		return 0
	}
	return h % len(r.e.p.LockURLs)
}

func (r *run) executor(owner string, d *doer) (*executor.Executor, error) {
	cfg := executor.DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL = r.e.p.LockURLs[r.replicaOf(d.holder)], r.e.p.PayURL, r.e.p.ProxyURL
	cfg.Owner, cfg.LeaseTTL = owner, ttl
	cfg.AcquireWait, cfg.RequestTimeout, cfg.RailTimeout = 5*time.Minute, 5*time.Minute, 5*time.Minute
	// Only a crashed process's calls fail in a schedule: its retries need
	// not wait on the real clock.
	cfg.ReportRetry.Initial, cfg.ReportRetry.Max = time.Millisecond, time.Millisecond
	return executor.New(cfg, r.e.log.With("service", "executor", "worker", owner), executor.WithHTTPClient(d))
}

func (r *run) reconciler(owner string, d *doer) (*reconciler.Reconciler, error) {
	cfg := reconciler.DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL = r.e.p.LockURLs[r.replicaOf(d.holder)], r.e.p.PayURL, r.e.p.ProxyURL
	cfg.Owner, cfg.LeaseTTL = owner, ttl
	cfg.AcquireWait, cfg.RequestTimeout = 5*time.Minute, 5*time.Minute
	return reconciler.New(cfg, r.e.log.With("service", "reconciler", "worker", owner), reconciler.WithHTTPClient(d))
}

// settleAll runs the reconciler x over every payout of the run, in order.
func (r *run) settleAll(ctx context.Context, x *reconciler.Reconciler) ([]reconciler.Result, error) {
	var out []reconciler.Result
	for _, ev := range r.events {
		res, err := x.Settle(ctx, ev.PayoutID)
		if err != nil {
			return out, err
		}
		out = append(out, res)
	}
	return out, nil
}
