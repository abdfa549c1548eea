package explore

// Traffic: what the actors do. Each schedule starts one to three
// executors and, optionally, the reconciler, on the real code, through
// transports the explorer owns (intercept.go); the steps below are where
// each is held.

import (
	"context"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/reconciler"
)

// Steps: the points where an executor is held, named by what happens
// when it is let go.
const (
	StepAcquire = "acquire" // the acquire request reaches lock-server
	StepConfirm = "confirm" // a lease confirmation (renew) reaches lock-server
	StepClaim   = "claim"   // the claim reaches payment-resource
	StepLookup  = "lookup"  // a rail attempt look-up reaches rail-proxy
	StepSubmit  = "submit"  // the submission reaches rail-proxy
	StepRail    = "rail"    // rail-proxy's call reaches the rail
	StepReport  = "report"  // the result reaches payment-resource
	StepRelease = "release" // the release reaches lock-server
	// StepAttention: a needs_attention mark reaches payment-resource.
	StepAttention = "attention"
	// The reconciler's own steps (its acquire and release are StepAcquire
	// and StepRelease).
	StepRead      = "read"      // its read of the payout's state reaches payment-resource
	StepReconcile = "reconcile" // its reconciliation reaches rail-proxy
	StepResolve   = "resolve"   // its resolution reaches payment-resource
	stepDone      = "done"
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

// sched is a schedule in progress: the actors, where each is held, and
// what the choices so far did.
type sched struct {
	cfg     Config
	res     Result
	actors  []int                      // holder indexes, the reconciler last
	pending map[int]arrival            // where each actor is held, or done
	kill    map[int]context.CancelFunc // crashes an actor
	steps   []stepRecord
	ended   []endedLease
	faults  int
	// aged and restarted: FaultAge and FaultRestart were taken.
	aged, restarted bool
	// proxyCall is a rail call rail-proxy still holds after its caller
	// gave up on it; nil when there is none.
	proxyCall *arrival
}

// startActors starts cfg's executors (each delivering payout i mod
// Payouts) and the reconciler, each on a context of its own under runCtx,
// and waits until every one is held at its first step (or done).
func (r *run) startActors(runCtx context.Context, cfg Config) (*sched, error) {
	s := &sched{cfg: cfg, kill: map[int]context.CancelFunc{}, pending: map[int]arrival{}, actors: make([]int, 0, cfg.Holders+1)}
	done := func(h int, err error) {
		select {
		case r.arrive <- arrival{holder: h, step: stepDone, err: err}:
		case <-runCtx.Done():
		}
	}
	for h := range cfg.Holders {
		s.actors = append(s.actors, h)
		r.doers[h] = &doer{r: r, holder: h}
		x, err := r.executor(holderName(h), r.doers[h])
		if err != nil {
			return nil, err
		}
		ev := r.events[h%len(r.events)]
		actx, cancel := context.WithCancel(runCtx)
		s.kill[h] = cancel
		go func() {
			_, err := x.Execute(actx, ev)
			// Execute has answered; its release goes to lock-server after
			// that, from a goroutine of its own, as this actor's next held
			// step (StepRelease). Waiting for it here keeps one step of
			// this actor in flight at a time, and the actor done only
			// once its release has been let go (or it crashed).
			_ = x.Close(context.WithoutCancel(actx))
			done(h, err)
		}()
	}
	if cfg.Reconciler {
		s.actors = append(s.actors, reconcilerIndex)
		d := &doer{r: r, holder: reconcilerIndex}
		x, err := r.reconciler(Reconciler, d)
		if err != nil {
			return nil, err
		}
		actx, cancel := context.WithCancel(runCtx)
		s.kill[reconcilerIndex] = cancel
		go func() {
			_, err := r.settleAll(actx, x)
			if d.crashed.Load() {
				err = nil // its read failed because it died
			}
			done(reconcilerIndex, err)
		}()
	}
	for len(s.pending) < len(s.actors) {
		a := <-r.arrive
		s.pending[a.holder] = a
	}
	return s, nil
}
