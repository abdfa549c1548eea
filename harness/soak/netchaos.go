package soak

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/local/link"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

// Kinds of fault a soak draws (Config.Faults).
const (
	// FaultsKill kills processes and clusters (SIGKILL, then a restart).
	FaultsKill = "kill"
	// FaultsNet puts network faults on the stack's links (package
	// local/link): latency, bandwidth, timeouts, answers lost, cuts.
	FaultsNet = "net"
)

// DefaultNetHold is the mean time a network fault stays on its link;
// each is drawn uniformly from [NetHold/2, 3·NetHold/2].
const DefaultNetHold = 2 * time.Second

// NetFault is one network fault of the soak.
type NetFault struct {
	// Link is the stack's link (stack.LinkRail, executor-A->lock-server, ...).
	Link string `json:"link"`
	// Fault is what was put on it.
	Fault link.Fault `json:"fault"`
	// At is when it was put on; AtS the same in seconds since the load
	// started; HoldMs how long it stayed before the link was healed.
	At     time.Time `json:"at"`
	AtS    float64   `json:"atS"`
	HoldMs int64     `json:"holdMs"`
	// NextPostedMs is from the fault's start to the next payout posted,
	// from paydb's transitions; nil when none was posted after it.
	NextPostedMs *int64 `json:"nextPostedMs"`
}

// ParseFaults splits a comma-separated list of fault kinds (FaultsKill,
// FaultsNet) as `make soak SOAK_FAULTS=kill,net` gives it.
func ParseFaults(s string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		switch f = strings.TrimSpace(f); f {
		case FaultsKill, FaultsNet:
			if !slices.Contains(out, f) {
				out = append(out, f)
			}
		case "":
		default:
			return nil, fmt.Errorf("%w: fault kind %q: want %s or %s", ErrInvalidConfig, f, FaultsKill, FaultsNet)
		}
	}
	return out, nil
}

// netChaos puts a seeded random fault on a seeded random link, holds it,
// heals it, and draws again.
type netChaos struct {
	cfg Config
	st  *stack.Stack
	log *slog.Logger
	rng *rand.Rand
}

func newNetChaos(cfg Config, st *stack.Stack, log *slog.Logger) *netChaos {
	return &netChaos{cfg: cfg, st: st, log: log, rng: rand.New(rand.NewPCG(cfg.Seed, 3))}
}

// draw returns a fault of a kind drawn from the seed, with its figures.
func (c *netChaos) draw() link.Fault {
	switch k := link.Kinds[c.rng.IntN(len(link.Kinds))]; k {
	case link.Latency:
		lat := time.Duration(50+c.rng.IntN(451)) * time.Millisecond
		return link.Fault{Kind: k, Latency: lat, Jitter: lat / 2, Seed: c.rng.Uint64()}
	case link.Bandwidth:
		return link.Fault{Kind: k, RateKBps: int64(8 << c.rng.IntN(5))} // 8..128 KB/s
	case link.ResetAfter:
		return link.Fault{Kind: k, Bytes: int64(c.rng.IntN(2) * 64)} // the whole answer lost, or its start only
	default:
		return link.Fault{Kind: k}
	}
}

// run draws faults, one link at a time, until created is closed (every
// payout created) or ctx ends; with MaxRounds, it stops after that many
// passes over the links.
// An error is a link that could not be faulted or healed.
func (c *netChaos) run(ctx context.Context, created <-chan struct{}) ([]NetFault, error) {
	names := c.st.LinkNames()
	out := []NetFault{}
	for round := 0; ; round++ {
		if c.cfg.MaxRounds > 0 && round >= c.cfg.MaxRounds {
			return out, nil
		}
		for _, i := range c.rng.Perm(len(names)) {
			select {
			case <-created:
				return out, nil
			default:
			}
			gap := c.cfg.KillGap/2 + time.Duration(c.rng.Int64N(int64(c.cfg.KillGap)+1))
			hold := c.cfg.NetHold/2 + time.Duration(c.rng.Int64N(int64(c.cfg.NetHold)+1))
			f := c.draw()
			// The moments are the schedule itself, not conditions.
			if !pause(ctx, gap) {
				return out, nil
			}
			l, err := c.st.Link(names[i])
			if err != nil {
				return out, err
			}
			nf := NetFault{Link: names[i], Fault: f, At: time.Now()}
			if err := l.Inject(f); err != nil {
				return out, err
			}
			pause(ctx, hold)
			if err := l.Heal(); err != nil {
				return out, err
			}
			nf.HoldMs = time.Since(nf.At).Milliseconds()
			c.log.Info("network fault held and healed", "link", nf.Link, "fault", f.String(), "holdMs", nf.HoldMs)
			out = append(out, nf)
		}
	}
}

// pause waits d; false when ctx ended first.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
