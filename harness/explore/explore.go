// Package explore runs schedules of the payout pipeline: one to three
// executors, and optionally the reconciler, on the real code of every
// service, with the explorer choosing each next step and each fault; after
// every schedule it judges the records (rail journal, raildb, paydb).
// Start with New, then Replay a schedule string, or run Exhaustive or
// Sample; harness/README.md explains the steps, faults and checks.
package explore

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/pipelinetest"
)

// Config bounds the schedules explored.
type Config struct {
	// Holders is how many executors run, 1..MaxHolders.
	Holders int
	// Payouts is how many payouts of one account the executors work on,
	// 1 (the default, for 0) or 2: executor i delivers payout i mod
	// Payouts. With two, the payouts share the account's lock and its
	// account fence, and a stale holder of one meets the fence raised by
	// a holder of the other.
	Payouts int
	// Reconciler adds the reconciler ("R") as one more scheduled actor:
	// it reads each payout's state and settles the ones in doubt (the
	// reconciler package's Settle), under the payout's lease.
	Reconciler bool
	// MaxFaults is how many faults a schedule may inject.
	MaxFaults int
	// Faults are the kinds injected (FaultExpire, FaultRevoke,
	// FaultRailLost, FaultRailDown, FaultRailRefused, FaultCrash,
	// FaultGiveUp, FaultForge, FaultResend, FaultReject, FaultRestart).
	Faults []string
}

// Result is the outcome of one schedule.
type Result struct {
	// Schedule is the sequence of choices made.
	Schedule Schedule
	// Violations lists every broken check, one line each; empty when the
	// schedule passed.
	Violations []string
	// Checks names the checks broken (a Check constant each), sorted.
	Checks []string
	// Ended is each payout's state after the last delivery and the
	// reconciler, in the order of the run's payouts (payment-resource's
	// api.State values).
	Ended []string
	// Paths names the rail-proxy outcomes the schedule reached (Path
	// constants, sorted, each once), judged from rail-proxy's answers and
	// raildb: coverage evidence, not a check.
	Paths []string
	// RestartedGrants counts the grants a scheduled actor got from a
	// lock-server replica after FaultRestart restarted it: coverage
	// evidence, not a check.
	RestartedGrants int
}

// Explorer runs schedules against one pipeline. Each schedule has its own
// payout and account, so schedules never see each other's records.
type Explorer struct {
	p    *pipelinetest.Pipeline
	log  *slog.Logger
	seq  atomic.Int64
	runs sync.Map // payout id -> *run, for the rail hook
	// decoy is another account's payout whose signature a forgery borrows
	// (FaultForge).
	decoy decoy
}

// New starts a pipeline (pipelinetest.Start with opts, its RailHandler
// and ProxyHandler replaced by the explorer's), creates the decoy payout
// whose signature FaultForge borrows (payout decoy-1 of acct-decoy), and
// returns an Explorer over it.
func New(t testing.TB, opts pipelinetest.Options) *Explorer {
	t.Helper()
	e := &Explorer{log: opts.Log}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	opts.RailHandler, opts.ProxyHandler = e.holdRail, e.watchProxy
	e.p = pipelinetest.Start(t, opts)
	d, err := e.newDecoy(context.Background())
	if err != nil {
		t.Fatalf("explore: the decoy payout: %v", err)
	}
	e.decoy = d
	return e
}

// arrival is an actor (executor or reconciler) stopped at a step, or done.
type arrival struct {
	holder int
	step   string
	resume chan string // receives the choice's step (or FaultRailLost, FaultRailDown, FaultCrash); nil when done
	err    error       // when done
}

// stepRecord is one step taken, for the checks.
type stepRecord struct {
	index  int // position in the schedule
	holder int
	step   string
}

// run is one schedule in progress.
type run struct {
	e       *Explorer
	events  []payoutevent.Event // the payouts, all of one account
	arrive  chan arrival
	running atomic.Int32 // the holder let go last; -1 when unscheduled

	// detached is the holder whose rail call rail-proxy still holds after
	// the holder gave up on it (-1: none); proxyDone receives when
	// rail-proxy's handling of that call has ended.
	detached  atomic.Int32
	proxyDone chan struct{}
	doers     map[int]*doer
	// ended is closed when Run returns: whatever is still held then
	// (after an error of the explorer's own) is let go, the rail's calls
	// as if the rail were down, so that no server waits forever.
	ended chan struct{}

	mu     sync.Mutex
	grants []int64 // tokens granted, in order
	tokens map[int]int64
	// restarted is the lock-server replica FaultRestart restarted (-1:
	// none); restartedGrants counts the grants it made since.
	restarted       int
	restartedGrants int

	// forging is set while a holder's forged submissions are sent: a
	// rail call they cause (with the terms check broken) is not held.
	forging atomic.Bool
	// detachedResend tells watchProxy that the detached call is a resend
	// (FaultResend), not a call its caller gave up on.
	detachedResend atomic.Bool
	// bg counts the resends still waiting for their answer.
	bg sync.WaitGroup
	// seen is what rail-proxy answered and what the forgeries did
	// (adversary.go).
	seen seen
	// registered lists the payouts e.runs maps to this run.
	registered []string
}

// Run runs one schedule of cfg, asking choose at each decision, and checks
// its outcome. The error is the explorer's own (a service that failed, a
// nondeterministic replay), never a broken check.
func (e *Explorer) Run(ctx context.Context, cfg Config, choose Chooser) (Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return Result{}, err
	}
	r := e.newRun(cfg)
	defer r.close()
	if err := r.createPayouts(ctx); err != nil {
		return Result{}, err
	}
	// Each actor runs on a context of its own: a crash cancels it, so
	// that the dead process's loops (the SDK's acquire retries) end at
	// once. Whatever happens, no actor outlives the run.
	runCtx, endRun := context.WithCancel(ctx)
	defer endRun()
	s, err := r.startActors(runCtx, cfg)
	if err != nil {
		return Result{}, err
	}
	key := r.events[0].LockKey()
	for {
		state, err := e.p.Locks.Inspect(ctx, key)
		if err != nil {
			return s.res, err
		}
		enabled, err := r.enabled(ctx, s, state.Lease != nil)
		if err != nil {
			return s.res, err
		}
		if len(enabled) == 0 {
			break
		}
		i, err := choose(len(s.res.Schedule), enabled)
		if err != nil {
			return s.res, err
		}
		c := enabled[i]
		s.res.Schedule = append(s.res.Schedule, c)
		if err := r.take(ctx, runCtx, s, c, state); err != nil {
			return s.res, err
		}
	}
	return r.end(ctx, s)
}

// withDefaults checks c and fills Payouts.
func (c Config) withDefaults() (Config, error) {
	if c.Holders < 1 || c.Holders > MaxHolders {
		return c, fmt.Errorf("explore: %d holders; want 1..%d", c.Holders, MaxHolders)
	}
	if c.Payouts == 0 {
		c.Payouts = 1
	}
	if c.Payouts < 1 || c.Payouts > 2 {
		return c, fmt.Errorf("explore: %d payouts; want 1 or 2", c.Payouts)
	}
	return c, nil
}

// newRun names the payouts of a new schedule, all of one new account.
func (e *Explorer) newRun(cfg Config) *run {
	n := e.seq.Add(1)
	r := &run{e: e, arrive: make(chan arrival), tokens: map[int]int64{}, proxyDone: make(chan struct{}, 1), doers: map[int]*doer{},
		ended: make(chan struct{})}
	r.detached.Store(-1)
	r.restarted = -1
	r.running.Store(-1)
	for i := range cfg.Payouts {
		id := fmt.Sprintf("p-%d", n)
		if i > 0 {
			id = fmt.Sprintf("p-%d-%d", n, i+1)
		}
		r.events = append(r.events, payoutevent.Event{PayoutID: id, AccountID: fmt.Sprintf("acct-%d", n), AmountMinor: 2500 + int64(i)*100, Currency: "EUR"})
	}
	return r
}

// createPayouts creates the run's payouts at payment-resource and lets
// the rail's and rail-proxy's handlers find the run by payout.
func (r *run) createPayouts(ctx context.Context) error {
	for _, ev := range r.events {
		if err := r.e.p.CreatePayout(ctx, ev); err != nil {
			return err
		}
		r.e.runs.Store(ev.PayoutID, r)
		r.registered = append(r.registered, ev.PayoutID)
	}
	return nil
}

// close forgets the run's payouts and lets go whatever is still held.
func (r *run) close() {
	for _, id := range slices.Backward(r.registered) {
		r.e.runs.Delete(id)
	}
	close(r.ended)
}

// end lets go what rail-proxy still holds once no choice is left, runs
// the last delivery and the reconciler (finish), and checks the records.
func (r *run) end(ctx context.Context, s *sched) (Result, error) {
	r.running.Store(-1)
	if s.proxyCall != nil {
		if err := r.letProxyGo(ctx, s.proxyCall, StepRail); err != nil {
			return s.res, err
		}
	}
	if err := r.finish(ctx); err != nil {
		return s.res, err
	}
	r.bg.Wait()
	r.mu.Lock()
	s.res.RestartedGrants = r.restartedGrants
	r.mu.Unlock()
	return s.res, r.check(ctx, &s.res, s.steps, s.ended)
}
