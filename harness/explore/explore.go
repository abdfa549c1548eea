// Package explore is a schedule explorer for the payout pipeline: it runs
// one to three executors on the same payout (or on two payouts of one
// account), and optionally the reconciler, on the real code of every
// service, and decides, one step at a time, which of them moves next,
// when a lease ends behind its holder's back, when the rail loses an
// answer and when a process dies. After each schedule it judges the
// outcome from the rail's journal, raildb and paydb (payoutaudit), never
// from what the workers reported.
//
// # How the steps are held
//
// Each executor sends every request through a transport owned by the
// explorer. A request that writes or decides (acquire, lease confirmation,
// claim, rail attempt look-up, submission, report, release) stops in that
// transport until the explorer lets it go; so does rail-proxy's call to
// the rail, held in front of the rail-stub. Everything between two held
// points runs to completion before the explorer chooses again, and only
// one executor runs at a time, so a schedule is a sequence of choices and
// is replayed exactly from it. A request held in the transport has not
// reached its server yet: holding it is the network delaying it, as long
// as the explorer likes. The read of the payout that every execution
// starts with is not held: the facts it reads never change.
//
// Between two steps the explorer may also inject a fault on the payout's
// lock key:
//
//   - expire: the lock store's clock jumps past the TTL, so the live lease
//     ends on the server while its holder's local deadline (on the real
//     clock, ten minutes away) still says it holds: a paused process, a
//     lost renewal, an etcd lease revoked by id, or lockdb's clock stepping
//     forward all look like this to the pipeline;
//   - revoke: an operator's revoke of the live lease, acknowledged.
//
// lock-server may run as two replicas over the one lock store, as its
// Deployment runs two pods (pipelinetest.Options.LockReplicas, given to
// New): executors A and C talk to the first ("L1"), B and the reconciler
// to the second ("L2"). "L1:restart" or "L2:restart", once per schedule
// after the first grant, restarts that replica between two steps: a new
// Server over a newly opened store serves at its URL, its token floor
// forgotten, and a request held for it reaches the new one.
//
// At a held rail call the explorer may instead lose the rail's answer
// (the rail pays; rail-proxy records the attempt ambiguous) or keep the
// call from the rail (rail-proxy cannot tell the difference). At any other
// held step it may crash the actor: nothing more leaves that process, and
// its lease ends by its TTL.
//
// The reconciler ("R") is one more actor when configured: its read of a
// payout's state, its acquire, its reconciliation at rail-proxy, its
// resolution at payment-resource and its release are held like an
// executor's steps. Its reconciliation needs the attempt to be older than
// rail-proxy's abandon threshold: the explorer offers "age" (every attempt
// of the run becomes that old on raildb's clock) once per schedule, while
// something is in doubt, even while a rail call is still held (a call
// stuck in a network longer than the threshold). A holder may also give
// up on its submission while rail-proxy's call to the rail is held
// ("A:giveup"); that call then becomes rail-proxy's own step ("P:rail"),
// let go whenever the explorer likes, for example after the reconciler
// has found nothing at the rail. rail-proxy's stop order at the rail is
// what keeps such a late call from paying a payout already ended failed.
//
// Three faults model what a holder, or the network, may do beyond the
// executor's own code. "A:forge", taken instead of A's submission once:
// A, whose lease is real, first sends its payout with altered terms
// (another amount or another account under the payout's own signature,
// another payout's signature, a signature over another amount by a key
// that is not payment-resource's), each with its own token and proof, and
// is then back at its genuine submission. "A:resend": a copy of A's last
// submission, same token, proof and terms, reaches rail-proxy again at
// any later point (a client's retry, a duplicated request); its rail
// call, if any, is rail-proxy's step like a given-up one. With "refused"
// this reaches the holder's own resend after a not_sent release and a
// stale holder's resend after a newer holder's release; with "giveup" and
// "age", a release that races an abandonment or a reconciliation.
// "A:reject", taken instead of A's submission: it is refused for good
// before rail-proxy records anything (400 INVALID_REQUEST), A marks the
// payout needs_attention, and the reconciler closes a payout rail-proxy
// never forwarded, after which a late submission must be refused.
//
// A duplicate delivery is one more executor: the schedule decides when
// each one starts acquiring. An acquire is only let go when the key is
// free, so a schedule never waits on the real clock. The executor's
// acquire waits in lock-server's queue of the key while another holds it,
// and is granted right after that release (or expiry): the same grant at
// the same point of the schedule as one let go then, having written
// nothing meanwhile.
//
// An executor answers its push before it releases: Execute returns, then
// the release goes to lock-server from a goroutine of its own. The
// release stays that actor's last held step (StepRelease), and the actor
// is done only once it has been let go or the actor has crashed; the
// explorer may move every other actor, or inject a fault, between the
// actor's last write and its release, as before.
//
// # What is checked after each schedule
//
// After the scheduled actors are done, one more delivery of each payout
// runs to the end unscheduled (Pub/Sub redelivers until a 2xx), time
// passes beyond the abandon threshold and an unscheduled reconciler
// settles what is left in doubt (its next pass), then:
//
//   - every payout is posted, declined or failed (CheckSettled);
//   - INV-04 and INV-05 across the records (payoutaudit.Run on the payouts):
//     at most one rail submission, rail acknowledgements equal to ledger
//     debits, every submission through rail-proxy, the recorded token the
//     one that reached the rail, nothing left unreconciled;
//   - INV-02: the tokens of successive grants strictly increase;
//   - INV-03: rail-proxy forwarded the account's submissions in strictly
//     increasing token order (one equal token only: a holder's own resend
//     of a payout whose forward with it was released not_sent), each
//     payout's fenced writes never went back to a lower token, and no
//     write of a payout of the account carried a token below the
//     account's last debit (the account fence);
//   - revoke takes effect: when the server ended a holder's lease (expire
//     or revoke) before the holder's last lease check preceding its
//     submission, that submission never reached the rail. The last check
//     is the holder's last confirmation with lock-server, or, for an
//     executor that only checks its local deadline, the submission itself;
//   - signed terms (CheckTerms): every forgery refused 403 with raildb
//     unchanged (no attempt, no forward, no high-water mark, for the
//     payout, its account and the forged account), and only paydb's terms
//     in the rail's journal and in raildb's attempts;
//   - recorded outcomes (CheckRecorded): an attempt rail-proxy answered
//     as the payout's forward with an outcome (ambiguous, acked, declined,
//     not_at_rail) is still its forward at the end, its outcome unchanged
//     or, from ambiguous, resolved; and after a reconciliation closed a
//     never-forwarded payout, no submission of it went to the rail.
//
// Each Result also names the rail-proxy outcomes its schedule reached
// (Result.Paths, the Path constants), from rail-proxy's answers as they
// leave it and from raildb: coverage evidence that a test can insist on.
//
// INV-01 and INV-06 are properties of the lock service alone; they are
// checked by lockserver/store/storetest (linearizability) and the SDK's
// simulation, not here.
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
