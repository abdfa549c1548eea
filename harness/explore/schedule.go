package explore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
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
