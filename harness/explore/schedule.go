package explore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
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

// Faults the explorer injects between steps.
const (
	// FaultExpire ends the live lease on the server's clock.
	FaultExpire = "expire"
	// FaultRevoke revokes the live lease, as an operator would.
	FaultRevoke = "revoke"
	// FaultRailLost is taken instead of a holder's StepRail ("A:lost"):
	// the rail pays and its answer to rail-proxy is lost (rail-proxy
	// records the attempt ambiguous).
	FaultRailLost = "lost"
	// FaultRailDown is taken instead of a holder's StepRail ("A:down"):
	// the call never reaches the rail, and rail-proxy cannot tell that from
	// a lost answer (ambiguous too).
	FaultRailDown = "down"
	// FaultRailRefused is taken instead of a holder's StepRail
	// ("A:refused"): the rail refuses the call and says it recorded
	// nothing (rail-stub's 503 RAIL_UNAVAILABLE), which rail-proxy answers
	// RAIL_NOT_REACHED and the executor redelivers. Offered only when a
	// Config's Faults name it.
	FaultRailRefused = "refused"
	// FaultCrash is taken instead of any held step of a holder ("A:crash",
	// never at StepRail, where the call is rail-proxy's): the process dies
	// there. Nothing more leaves it; its lease ends by its TTL.
	FaultCrash = "crash"
	// FaultGiveUp is taken instead of a holder's StepRail ("A:giveup"):
	// the holder's own timeout cuts its call to rail-proxy, while
	// rail-proxy's call to the rail stays held. That call becomes
	// rail-proxy's pending step ("P:rail", or "P:lost", "P:down"), which
	// the explorer lets go whenever it likes, for example after the
	// reconciler has looked the payout up.
	FaultGiveUp = "giveup"
	// FaultAge is not a fault but time passing: every rail attempt of the
	// run becomes older than rail-proxy's abandon threshold, so that the
	// reconciler may reconcile an attempt in doubt. Offered once per
	// schedule, with the reconciler, while an attempt is in doubt, also
	// while a rail call is still held (harness/README.md).
	FaultAge = "age"
	// FaultForge is taken instead of a holder's StepSubmit ("A:forge"),
	// once per holder: the holder, whose lease is real, first sends its
	// submission with altered terms (adversary.go: another amount,
	// another account, another payout's signature, a signature that is
	// not payment-resource's), each with its own token and proof; then it
	// is back at StepSubmit with its genuine submission. Each forged
	// submission must be refused 403 with nothing recorded at rail-proxy.
	FaultForge = "forge"
	// FaultResend ("A:resend"): a copy of the holder's last submission,
	// same token, proof and terms, reaches rail-proxy again (the holder's
	// client retried it, or the network duplicated it), at any later
	// point of the schedule, once per holder. Its answer reaches nobody;
	// its rail call, if rail-proxy makes one, is rail-proxy's pending step
	// ("P:rail", "P:refused", ...), as after FaultGiveUp.
	FaultResend = "resend"
	// FaultReject is taken instead of a holder's StepSubmit ("A:reject"):
	// the submission is refused for good before rail-proxy records
	// anything (the explorer answers 400 INVALID_REQUEST in its place,
	// as rail-proxy answers a request no retry can change), so the holder
	// marks the payout needs_attention, and the reconciler closes a
	// payout that was never forwarded.
	FaultReject = "reject"
	// FaultRestart restarts a lock-server replica ("L1:restart",
	// "L2:restart"): its Server is closed and a new one, over a newly
	// opened store on the same lock store, serves at its URL
	// (pipelinetest.Pipeline.RestartLock). It forgets the token floor it
	// kept; the leases and the token counter are the store's. A request
	// held for that replica reaches the new Server. Offered once per
	// schedule, after the first grant, while something else may still
	// happen.
	FaultRestart = "restart"
)

// Bounds of a schedule.
const (
	// MaxHolders is the most executors a schedule runs.
	MaxHolders = 3
	// Reconciler names the reconciler in a schedule ("R:read").
	Reconciler = "R"
	// reconcilerIndex is the reconciler's holder index.
	reconcilerIndex = MaxHolders
	// RailProxy names rail-proxy in a schedule ("P:rail"): it moves only
	// a rail call whose caller gave up (FaultGiveUp).
	RailProxy = "P"
	// railProxyIndex is rail-proxy's holder index.
	railProxyIndex = MaxHolders + 1
	// LockReplica names lock-server replica i (from 1) in a schedule
	// ("L2:restart"), with the replica's number after it.
	LockReplica = "L"
	// headerHolder tells the explorer's handler in front of rail-proxy
	// which actor sent a submission.
	headerHolder = "X-Explore-Holder"
	// ttl is every lease's TTL: longer than any schedule, so that only the
	// explorer's faults end a lease, and no background renewal runs.
	ttl = 10 * time.Minute
)

// Choice is one decision of a schedule: let a holder's step go, or inject
// a fault.
type Choice struct {
	// Holder is the executor moved ("A", "B", "C"), or the process the
	// step or fault is of ("R", "P", a lock-server replica "L1"), "" for
	// a fault on the lock.
	Holder string
	// Step is the step it takes (a Step constant), or the fault (a Fault
	// constant).
	Step string
}

// String is "A:claim" for a step (or a holder's fault, "A:crash"), the
// fault's name for a fault on the lock.
func (c Choice) String() string {
	if c.Holder == "" {
		return c.Step
	}
	return c.Holder + ":" + c.Step
}

// Schedule is a sequence of choices, written as their Strings separated
// by spaces.
type Schedule []Choice

// String writes s as ParseSchedule reads it.
func (s Schedule) String() string {
	parts := make([]string, len(s))
	for i, c := range s {
		parts[i] = c.String()
	}
	return strings.Join(parts, " ")
}

// ParseSchedule reads a schedule written by Schedule.String.
func ParseSchedule(text string) (Schedule, error) {
	var s Schedule
	for _, f := range strings.Fields(text) {
		h, step, ok := strings.Cut(f, ":")
		switch {
		case !ok && (f == FaultExpire || f == FaultRevoke || f == FaultAge):
			s = append(s, Choice{Step: f})
		case ok && (len(h) == 1 && h[0] >= 'A' && h[0] < 'A'+MaxHolders || h == Reconciler || h == RailProxy ||
			step == FaultRestart && replicaIndex(h) >= 0):
			s = append(s, Choice{Holder: h, Step: step})
		default:
			return nil, fmt.Errorf("explore: bad choice %q", f)
		}
	}
	return s, nil
}

// Chooser picks one of enabled (never empty) at a decision; depth counts
// the decisions made before it in the schedule.
type Chooser func(depth int, enabled []Choice) (int, error)

func holderName(h int) string {
	switch h {
	case reconcilerIndex:
		return Reconciler
	case railProxyIndex:
		return RailProxy
	}
	return string(rune('A' + h))
}

// replicaName names lock-server replica i (from 0) in a schedule.
func replicaName(i int) string { return fmt.Sprintf("%s%d", LockReplica, i+1) }

// replicaIndex is the replica name names (from 0), or -1.
func replicaIndex(name string) int {
	if len(name) == 2 && name[0] == LockReplica[0] && name[1] >= '1' && name[1] <= '9' {
		return int(name[1] - '1')
	}
	return -1
}

func holderIndex(name string) int {
	switch name {
	case Reconciler:
		return reconcilerIndex
	case RailProxy:
		return railProxyIndex
	}
	return int(name[0] - 'A')
}

// Replay runs the schedule s: at each decision it takes the choice s names,
// and fails if that choice is not enabled then (the code under test no
// longer has that step).
func (e *Explorer) Replay(ctx context.Context, cfg Config, s Schedule) (Result, error) {
	return e.Run(ctx, cfg, func(depth int, enabled []Choice) (int, error) {
		if depth >= len(s) {
			return 0, fmt.Errorf("explore: the schedule ends after %d choices, the run goes on (enabled %v)", len(s), enabled)
		}
		if i := slices.Index(enabled, s[depth]); i >= 0 {
			return i, nil
		}
		return 0, fmt.Errorf("explore: choice %d (%s) is not enabled; enabled: %v", depth, s[depth], enabled)
	})
}

// Exhaustive runs every schedule of cfg, depth first, calling visit with
// each result; it stops early when visit returns false. It returns the
// number of schedules run.
func (e *Explorer) Exhaustive(ctx context.Context, cfg Config, visit func(Result) bool) (int, error) {
	type node struct{ width, pick int }
	var path []node
	count := 0
	for {
		depth := 0
		res, err := e.Run(ctx, cfg, func(d int, enabled []Choice) (int, error) {
			depth = d + 1
			if d < len(path) {
				if path[d].width != len(enabled) {
					return 0, fmt.Errorf("explore: replay diverged at choice %d: %d choices, %d before", d, len(enabled), path[d].width)
				}
				return path[d].pick, nil
			}
			path = append(path, node{width: len(enabled)})
			return 0, nil
		})
		if err != nil {
			return count, fmt.Errorf("%w (schedule %s)", err, res.Schedule)
		}
		count++
		if !visit(res) {
			return count, nil
		}
		path = path[:depth]
		for len(path) > 0 && path[len(path)-1].pick+1 >= path[len(path)-1].width {
			path = path[:len(path)-1]
		}
		if len(path) == 0 {
			return count, nil
		}
		path[len(path)-1].pick++
	}
}

// Sample runs n schedules of cfg, each choice drawn at random by a
// generator seeded with seed, calling visit with each; it stops early
// when visit returns false. It returns the number of schedules run.
//
// The draw is weighted (weight), not uniform: a crash is enabled at
// nearly every step of every actor, and a uniform draw would spend the
// fault budget on crashes before any submission reached the rail, and
// move the reconciler before anything is in doubt. Exhaustive covers
// every choice alike.
func (e *Explorer) Sample(ctx context.Context, cfg Config, seed uint64, n int, visit func(Result) bool) (int, error) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := range n {
		res, err := e.Run(ctx, cfg, func(_ int, enabled []Choice) (int, error) {
			total := 0.0
			for _, c := range enabled {
				total += weight(c)
			}
			x := rng.Float64() * total
			for i, c := range enabled {
				if x -= weight(c); x < 0 {
					return i, nil
				}
			}
			return len(enabled) - 1, nil
		})
		if err != nil {
			return i, fmt.Errorf("%w (schedule %s)", err, res.Schedule)
		}
		if !visit(res) {
			return i + 1, nil
		}
	}
	return n, nil
}

// weight is a choice's weight in Sample's draw: a step 1, the rail's
// faults 1 each (they only compete with one step), a crash 0.05, the
// faults on the lease 0.3, the reconciler's read 0.05 and its other
// steps 0.2 (so that it tends to read once something is in doubt),
// rail-proxy's call whose
// caller gave up 0.05 (so that it tends to arrive late, after the others
// have moved on), time passing 1, a forgery 0.3, a resend or a refusal
// for good 0.15 (a resend is offered at nearly every decision), a
// lock-server restart 0.15 (so is it).
func weight(c Choice) float64 {
	switch {
	case c.Step == FaultRestart:
		return 0.15
	case c.Step == FaultResend, c.Step == FaultReject:
		return 0.15
	case c.Step == FaultForge:
		return 0.3
	case c.Step == FaultCrash, c.Holder == RailProxy, c.Holder == Reconciler && c.Step == StepRead:
		return 0.05
	case c.Holder == "" && c.Step != FaultAge:
		return 0.3
	case c.Holder == Reconciler:
		return 0.2
	}
	return 1
}
