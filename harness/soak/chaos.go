package soak

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

// TargetEtcdMember is the chaos target that kills one etcd member (a
// process of its own): the raft leader on the first etcd kill of a run,
// then the leader or a follower, drawn from the seed.
const TargetEtcdMember = "etcd-member"

// RestartTimeout bounds how long a killed part may take to be ready again
// after its restart; longer is a failure of the run (a part that does not
// come back is stuck for good).
const RestartTimeout = 90 * time.Second

// Kill is one kill of the chaos driver.
type Kill struct {
	// Target is the kind of part: a process name of the stack
	// (lock-server, executor-A, payment-resource, rail-proxy, rail-stub),
	// a cluster (postgres-lockdb, postgres-paydb) or TargetEtcdMember.
	Target string `json:"target"`
	// Process is what was killed: Target, or the etcd member's process
	// (etcd-0..2).
	Process string `json:"process"`
	// Leader says, for an etcd member, whether it was the raft leader
	// when it was killed.
	Leader *bool `json:"leader,omitempty"`
	// At is when SIGKILL was sent; AtS the same in seconds since the load
	// started.
	At  time.Time `json:"at"`
	AtS float64   `json:"atS"`
	// DownMs is how long the part stayed down before its restart began
	// (kill to restart, in ms).
	DownMs int64 `json:"downMs"`
	// ReadyMs is the recovery time "kill to the killed service ready
	// again" in ms: its readiness probe (lock-server /readyz, an HTTP
	// answer from a function, etcd's ready line, PostgreSQL accepting
	// connections) passed after the restart.
	ReadyMs int64 `json:"readyMs"`
	// NextPostedMs is the recovery time "kill to the next payout
	// posted" in ms, read from paydb's payout transitions; nil when no
	// payout was posted after the kill.
	NextPostedMs *int64 `json:"nextPostedMs"`
}

// chaos kills every kind of part in turn at seeded random moments.
type chaos struct {
	cfg     Config
	st      *stack.Stack
	log     *slog.Logger
	rng     *rand.Rand
	targets []string
	etcdN   int // etcd kills so far
}

func newChaos(cfg Config, st *stack.Stack, log *slog.Logger) *chaos {
	return &chaos{cfg: cfg, st: st, log: log, rng: rand.New(rand.NewPCG(cfg.Seed, 2)), targets: Targets(cfg.Backend, cfg.Executors)}
}

// Targets returns the kinds of part the chaos driver kills on backend
// with n executors, in a fixed order (each round shuffles it).
func Targets(backend string, n int) []string {
	t := []string{"lock-server"}
	for i := range n {
		t = append(t, executorName(i))
	}
	t = append(t, "payment-resource", "rail-proxy", "rail-stub", stack.ClusterPaydb)
	if backend == stack.BackendEtcd {
		return append(t, TargetEtcdMember)
	}
	return append(t, stack.ClusterLockdb)
}

// run kills round after round until at least cfg.Rounds rounds are done
// and created is closed (every payout created), or cfg.MaxRounds rounds
// are done, or ctx ends. An error is
// a part that could not be killed or did not come back.
func (c *chaos) run(ctx context.Context, created <-chan struct{}) ([]Kill, error) {
	kills := []Kill{}
	for round := 0; ; round++ {
		if c.cfg.MaxRounds > 0 && round >= c.cfg.MaxRounds {
			return kills, nil
		}
		if round >= c.cfg.Rounds {
			select {
			case <-created:
				return kills, nil
			default:
			}
		}
		for _, i := range c.rng.Perm(len(c.targets)) {
			gap := c.cfg.KillGap/2 + time.Duration(c.rng.Int64N(int64(c.cfg.KillGap)+1))
			down := time.Duration(c.rng.Int64N(int64(c.cfg.DownTime) + 1))
			// The moment of the kill is the schedule itself, not a
			// condition to wait for.
			t := time.NewTimer(gap)
			select {
			case <-ctx.Done():
				t.Stop()
				return kills, nil
			case <-t.C:
			}
			k, err := c.kill(ctx, c.targets[i], down)
			if err != nil {
				return kills, fmt.Errorf("round %d, %s: %w", round+1, c.targets[i], err)
			}
			kills = append(kills, k)
		}
	}
}

// kill kills target, keeps it down for down, restarts it and waits until
// it is ready.
func (c *chaos) kill(ctx context.Context, target string, down time.Duration) (Kill, error) {
	k := Kill{Target: target, Process: target}
	if target == TargetEtcdMember {
		wantLeader := c.etcdN == 0 || c.rng.IntN(2) == 0
		c.etcdN++
		name, leader, err := c.etcdMember(ctx, wantLeader)
		if err != nil {
			return k, err
		}
		k.Process, k.Leader = name, &leader
	}
	k.At = time.Now()
	if err := c.st.Kill(k.Process); err != nil {
		return k, fmt.Errorf("kill %s: %w", k.Process, err)
	}
	t := time.NewTimer(down)
	select {
	case <-ctx.Done():
		t.Stop()
	case <-t.C:
	}
	k.DownMs = time.Since(k.At).Milliseconds()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), RestartTimeout)
	defer cancel()
	if err := restart(rctx, c.st, k.Process); err != nil {
		return k, fmt.Errorf("restart %s: %w", k.Process, err)
	}
	k.ReadyMs = time.Since(k.At).Milliseconds()
	c.log.Info("killed and restarted", "target", target, "process", k.Process, "leader", k.Leader, "downMs", k.DownMs, "readyMs", k.ReadyMs)
	return k, nil
}

// restart restarts the part called name as a supervisor would: again,
// after a pause, when it exits during its start (a service whose database
// is out of reach at that moment, behind a network fault, exits), until it
// is ready or ctx ends.
func restart(ctx context.Context, st *stack.Stack, name string) error {
	for {
		err := st.Restart(ctx, name)
		if !errors.Is(err, stack.ErrExited) {
			return err
		}
		if !pause(ctx, 200*time.Millisecond) {
			return err
		}
	}
}

// etcdMember returns the process name of the etcd member to kill: the
// leader when wantLeader, otherwise a follower drawn from the seed; and
// whether it is the leader. It asks every member its status (the leader
// is the member whose id is the leader id it reports).
func (c *chaos) etcdMember(ctx context.Context, wantLeader bool) (string, bool, error) {
	eps := c.st.EtcdEndpoints()
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return "", false, err
	}
	defer cli.Close()
	leader := -1
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	// An election may be under way (a member was just restarted): poll
	// until one member reports itself leader.
	for leader < 0 {
		for i, ep := range eps {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := cli.Status(sctx, ep)
			cancel()
			if err == nil && st.Leader != 0 && st.Header.MemberId == st.Leader {
				leader = i
				break
			}
		}
		if leader >= 0 {
			break
		}
		if time.Now().After(deadline) {
			return "", false, errors.New("etcd: no member reports itself leader")
		}
		select {
		case <-ctx.Done():
			return "", false, ctx.Err()
		case <-tick.C:
		}
	}
	if wantLeader {
		return "etcd-" + strconv.Itoa(leader), true, nil
	}
	f := c.rng.IntN(len(eps) - 1)
	if f >= leader {
		f++
	}
	return "etcd-" + strconv.Itoa(f), false, nil
}
