// Package month runs a simulated month (SC-10): the local stack under the
// game day's steady load, scraped by a real Prometheus, with the faults a
// month on Google Cloud brings, each as often as a month brings it and
// each lasting as long as it would there. Only the healthy time between
// faults is compressed. The SLIs of ops/slo.yaml are read from
// Prometheus for each fault and for the whole run, scaled to 30 days and
// reported against the error-budget policy of docs/slo.md (Run, then
// Report.Markdown and Report.Chart). Run it with `make month` or
// ./harness/cmd/month; docs/month.md has the method, the rates with their
// sources, and a committed result.
package month

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/harness/drive"
	"github.com/distributed-lock-lab/distributed-lock-lab/harness/gameday"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
	"github.com/distributed-lock-lab/distributed-lock-lab/ops/slo"
)

// Sentinel errors.
var (
	// ErrInvalidConfig wraps every error of Config.Validate.
	ErrInvalidConfig = errors.New("month: invalid config")
	// ErrPrerequisite: Prometheus or Alertmanager is not installed.
	ErrPrerequisite = gameday.ErrPrerequisite
)

// Period is the SLO period a run stands for.
const Period = 30 * 24 * time.Hour

// Fault is one kind of fault a month brings.
type Fault struct {
	// Name is the cause the budget spent during it is booked under.
	Name string
	// Backend, when set, is the only lock-server backend it applies to.
	Backend string
	// PerMonth is how many times a month brings it; Down how long each
	// lasts (the part is brought back after it).
	PerMonth int
	Down     time.Duration
	// Parts are the stack parts it hits (stack names): all of them, or
	// with One a single one, chosen by the schedule's seed.
	Parts []string
	One   bool
	// Freeze stops the parts with SIGSTOP (alive, answering nothing, as a
	// request queued for an instance that is starting); otherwise they
	// are killed (SIGKILL) and restarted.
	Freeze bool
	// Source says where PerMonth and Down come from.
	Source string
}

// Faults are the faults of a month on the deployed shape (docs/month.md
// gives each source in full).
var Faults = []Fault{
	{
		Name: "lock-server-evicted", PerMonth: 10, Parts: []string{"lock-server"},
		Source: "GKE Autopilot node upgrades (patch upgrades as often as weekly, surge: each node drained) evict each of the 2 replicas 4 times, plus 1 move each for bin-packing (assumed); back as soon as restarted",
	},
	{
		Name: "etcd-member-evicted", Backend: stack.BackendEtcd, PerMonth: 15, Down: 5 * time.Second,
		Parts: []string{"etcd-0", "etcd-1", "etcd-2"}, One: true,
		Source: "the same drains for each of the 3 StatefulSet members (4 upgrades + 1 bin-packing move each); 5 s away (assumed: a quorum of 2 remains meanwhile)",
	},
	{
		Name: "lockdb-failover", Backend: stack.BackendPostgres, PerMonth: 1, Down: 60 * time.Second,
		Parts:  []string{stack.ClusterLockdb},
		Source: "Cloud SQL maintenance, typically once every few months, rounded up to one a month; connectivity lost for under 60 s on average (Enterprise edition); an HA failover keeps the IP and the data",
	},
	{
		Name: "paydb-maintenance", PerMonth: 1, Down: 60 * time.Second,
		Parts:  []string{stack.ClusterPaydb},
		Source: "the same Cloud SQL maintenance on the zonal paydb/raildb instance",
	},
	{
		Name: "cold-start-burst", PerMonth: 30, Down: 2 * time.Second, Freeze: true,
		Parts:  []string{"payment-resource", "executor-A"},
		Source: "Cloud Run scales to zero (min_instance_count = 0): one burst a day (assumed), requests wait 2 s for a new instance (assumed); the 99.95 % Cloud Run SLA is not spent on purpose",
	},
	{
		Name: "rail-outage", PerMonth: 1, Down: 90 * time.Second, Parts: []string{"rail-stub"},
		Source: "the payment rail is a fictional provider: one outage of 90 s a month (assumed)",
	},
}

// Config is one simulated month.
type Config struct {
	// Backend is lock-server's backend: stack.BackendPostgres or
	// stack.BackendEtcd (three members). Default postgres.
	Backend string
	// Seed chooses when in the month each fault happens, and which part
	// a fault with One hits.
	Seed uint64
	// Faults are the month's faults; those of another backend are
	// skipped. Default Faults.
	Faults []Fault
	// Healthy is the healthy run before the first fault: its bad events
	// stand for those of the month's healthy time. Default 60 s.
	Healthy time.Duration
	// Settle is the wait after a fault's part is back (and every payout
	// created before it finished) before the next fault. Default 3 s.
	Settle time.Duration
	// Drain bounds the wait for payouts created before a fault's end to
	// finish. Default 4 min (a payout's redeliveries back off up to
	// 300 s on Google Cloud's subscription, stack.CloudPushRetry).
	Drain time.Duration
	// Repo is the repository root (ops/ is read from it); Dir the run
	// folder (the stack's and Prometheus' files). Required.
	Repo, Dir string
	// Log receives progress lines. Default: discard.
	Log *slog.Logger
}

// DefaultConfig is a month on PostgreSQL with seed 1.
func DefaultConfig() Config {
	return Config{Backend: stack.BackendPostgres, Seed: 1, Faults: Faults, Healthy: 60 * time.Second, Settle: 3 * time.Second, Drain: 4 * time.Minute}
}

// Validate reports every invalid field, each wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
	if c.Backend != stack.BackendPostgres && c.Backend != stack.BackendEtcd {
		bad("Backend %q: want %q or %q", c.Backend, stack.BackendPostgres, stack.BackendEtcd)
	}
	if c.Repo == "" || c.Dir == "" {
		bad("Repo and Dir are required")
	}
	if c.Healthy <= 0 || c.Settle <= 0 || c.Drain <= 0 {
		bad("Healthy, Settle and Drain must be positive")
	}
	for _, f := range c.Faults {
		if f.Name == "" || f.PerMonth < 0 || f.Down < 0 || len(f.Parts) == 0 {
			bad("fault %q: want a name, parts, and PerMonth and Down not negative", f.Name)
		}
	}
	return errors.Join(errs...)
}

// Occurrence is one fault of the month.
type Occurrence struct {
	// At is when in the month it happens (from the schedule).
	At time.Duration `json:"at"`
	// Fault is the fault's name; Cause what the budget is booked under
	// (the fault, or for an etcd member its role: leader or follower);
	// Parts the parts it hit.
	Fault string   `json:"fault"`
	Cause string   `json:"cause"`
	Parts []string `json:"parts"`
	// Start and End bound the window its SLIs were measured over: from
	// the injection to the end of its settle.
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// Election is whether it evicted the etcd leader (an election).
	Election bool `json:"election,omitempty"`
	// Bad and Total are the events of each SLO in the window.
	Bad   map[string]float64 `json:"bad"`
	Total map[string]float64 `json:"total"`
}

// Schedule places each fault of cfg PerMonth times in the month, uniformly
// at random from cfg.Seed, sorted by time.
func Schedule(cfg Config) []Occurrence {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6d6f6e7468))
	var out []Occurrence
	for _, f := range cfg.Faults {
		if f.Backend != "" && f.Backend != cfg.Backend {
			continue
		}
		for range f.PerMonth {
			parts := f.Parts
			if f.One {
				parts = []string{f.Parts[rng.IntN(len(f.Parts))]}
			}
			out = append(out, Occurrence{At: time.Duration(rng.Int64N(int64(Period))), Fault: f.Name, Cause: f.Name, Parts: parts})
		}
	}
	slices.SortStableFunc(out, func(a, b Occurrence) int { return int(a.At - b.At) })
	return out
}

// Run runs the month of cfg and returns its report.
func Run(ctx context.Context, cfg Config) (Report, error) {
	rep := Report{Backend: cfg.Backend, Seed: cfg.Seed, Started: time.Now().UTC()}
	if err := cfg.Validate(); err != nil {
		return rep, err
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for _, bin := range []string{gameday.BinPrometheus, gameday.BinAlertmanager} {
		if _, err := exec.LookPath(bin); err != nil {
			return rep, fmt.Errorf("%w: %s is not on PATH (apt-get install prometheus prometheus-alertmanager)", ErrPrerequisite, bin)
		}
	}
	spec, err := slo.Load(filepath.Join(cfg.Repo, "ops", "slo.yaml"))
	if err != nil {
		return rep, err
	}
	for _, f := range cfg.Faults {
		if f.Backend == "" || f.Backend == cfg.Backend {
			rep.Faults = append(rep.Faults, f)
		}
	}
	occs := Schedule(cfg)
	bin, err := stack.CachedBinaries(ctx)
	if err != nil {
		return rep, err
	}
	scfg := stack.Config{Backend: cfg.Backend, PaymentFencing: true, RailFencing: true,
		Executors: []stack.ExecutorSpec{{Name: "A"}}, Dir: filepath.Join(cfg.Dir, "stack"), BinDir: bin, Log: log,
		PushRetry:   stack.CloudPushRetry, // faults last as long as on Google Cloud, so do redeliveries
		RailJournal: true}                 // a restarted rail keeps its record and never reuses a reference
	if cfg.Backend == stack.BackendEtcd {
		scfg.EtcdMembers = 3
	}
	d, err := drive.Start(ctx, scfg)
	if err != nil {
		return rep, err
	}
	defer d.Close()
	st := d.Stack()
	bridgeAddr, stopBridge, err := gameday.StartBridge(ctx, st)
	if err != nil {
		return rep, err
	}
	defer stopBridge() // before d.Close: the bridges use its Pub/Sub
	targets := targetsOf(st, bridgeAddr)
	mon, err := gameday.StartMonitor(ctx, cfg.Dir, filepath.Join(cfg.Repo, "ops", "prometheus", "rules.yml"), targets)
	if err != nil {
		return rep, err
	}
	defer mon.Stop()
	q := &querier{mon: mon, spec: spec}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, t := range targets {
		if err := mon.AwaitQuery(wctx, fmt.Sprintf(`up{job=%q,instance=%q} == 1`, t.Job, t.Addr)); err != nil {
			return rep, err
		}
	}
	stopLoad, err := gameday.StartLoad(ctx, d)
	if err != nil {
		return rep, err
	}
	defer stopLoad()
	for _, h := range []string{`sum(rate(lockserver_requests_total{op="acquire"}[10s])) > 0`, `sum(rate(payout_completion_seconds_count[10s])) > 0`} {
		if err := mon.AwaitQuery(wctx, h); err != nil {
			return rep, err
		}
	}
	rep.RunStart = time.Now()
	rep.LoadAverage[0] = loadAverage()
	log.Info("month started", "event", EventMonthStarted, "backend", cfg.Backend, "seed", cfg.Seed, "faults", len(occs))
	if err := wait(ctx, cfg.Healthy); err != nil {
		return rep, err
	}
	rep.HealthyEnd = time.Now()
	for i := range occs {
		o := &occs[i]
		if err := runOccurrence(ctx, cfg, d, q, byName(cfg.Faults, o.Fault), o); err != nil {
			rep.Occurrences = occs[:i]
			return rep, fmt.Errorf("%s at day %.1f: %w", o.Fault, o.At.Hours()/24, err)
		}
		log.Info("fault done", "event", EventFaultDone, "fault", o.Fault, "cause", o.Cause, "n", i+1, "of", len(occs))
	}
	rep.RunEnd = time.Now()
	rep.LoadAverage[1] = loadAverage()
	rep.Occurrences = occs
	// Prometheus has scraped past the run's end before its totals are read.
	if err := wait(ctx, 3*time.Second); err != nil {
		return rep, err
	}
	if rep.HealthyBad, _, err = q.window(ctx, rep.RunStart, rep.HealthyEnd); err != nil {
		return rep, err
	}
	if _, rep.RunTotal, err = q.window(ctx, rep.RunStart, rep.RunEnd); err != nil {
		return rep, err
	}
	if rep.PolicyElections, err = q.value(ctx, fmt.Sprintf(`max(increase(etcd_server_leader_changes_seen_total[%s]))`, promDuration(rep.RunEnd.Sub(rep.RunStart))), rep.RunEnd); err != nil {
		return rep, err
	}
	for _, s := range spec.SLOs {
		rep.Objectives = append(rep.Objectives, Objective{SLO: s.Name, Objective: s.Objective})
	}
	rep.compute()
	return rep, nil
}

// Progress events (the log's event attribute).
const (
	EventMonthStarted = "month_started"
	EventFaultDone    = "month_fault_done"
)

func byName(fs []Fault, name string) Fault {
	for _, f := range fs {
		if f.Name == name {
			return f
		}
	}
	return Fault{}
}

// runOccurrence injects o, waits its Down, brings the parts back, waits
// until every payout created before then has finished (cfg.Drain at most)
// and cfg.Settle, and reads the SLIs of the window: from the injection
// to the end of the settle.
func runOccurrence(ctx context.Context, cfg Config, d *drive.Driver, q *querier, f Fault, o *Occurrence) error {
	st := d.Stack()
	o.Start = time.Now()
	if f.Backend == stack.BackendEtcd {
		// An eviction of the leader is an election.
		addr := strings.TrimPrefix(st.EtcdEndpoints()[slices.Index(f.Parts, o.Parts[0])], "http://")
		v, err := q.value(ctx, fmt.Sprintf(`etcd_server_is_leader{instance=%q}`, addr), time.Now())
		if err != nil {
			return err
		}
		o.Election = v == 1
		o.Cause = f.Name + " (follower)"
		if o.Election {
			o.Cause = f.Name + " (leader)"
		}
	}
	for _, p := range o.Parts {
		var err error
		if f.Freeze {
			err = st.Freeze(p)
		} else {
			err = st.Kill(p)
		}
		if err != nil {
			return err
		}
	}
	if err := wait(ctx, f.Down); err != nil {
		return err
	}
	for _, p := range o.Parts {
		var err error
		if f.Freeze {
			err = st.Thaw(p)
		} else {
			err = st.Restart(ctx, p)
		}
		if err != nil {
			return err
		}
	}
	if err := drained(ctx, d, time.Now(), cfg.Drain); err != nil {
		return err
	}
	if err := wait(ctx, cfg.Settle); err != nil {
		return err
	}
	o.End = time.Now()
	var err error
	o.Bad, o.Total, err = q.window(ctx, o.Start, o.End)
	return err
}

// drained waits until no payout created before t is unfinished
// (pending, claimed, submitted or acknowledged), within limit: payouts a
// fault delayed finish inside its window. An ambiguous payout waits for
// a reconciler this run does not start.
func drained(ctx context.Context, d *drive.Driver, t time.Time, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		var n int
		err := d.PayDB.QueryRow(ctx, `SELECT count(*) FROM payout WHERE state IN ('pending', 'claimed', 'submitted', 'acknowledged') AND created_at < $1`, t).Scan(&n)
		if err == nil && n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("payouts created before the fault's end still unfinished (%d, last error %v): %w", n, err, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// loadAverage is the machine's load average over the last minute, as
// /proc/loadavg has it ("" where it cannot be read): the latency SLO
// measures the machine too.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// wait returns after d, or with ctx's error.
func wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// targetsOf are the scrape jobs of st as the game day names them (the
// rules' job names), with the push bridges' metrics at bridgeAddr.
func targetsOf(st *stack.Stack, bridgeAddr string) []gameday.Target {
	host := func(u string) string { return strings.TrimPrefix(u, "http://") }
	ts := []gameday.Target{
		{Job: "lock-server", Addr: host(st.LockServerURL())},
		// Its /metrics may wait 2 s for paydb's ages.
		{Job: "payment-resource", Addr: host(st.PaymentResourceURL()), Interval: 3 * time.Second},
		{Job: "rail-proxy", Addr: host(st.RailProxyURL())},
		{Job: "rail-stub", Addr: host(st.RailStubURL())},
		{Job: "executor", Addr: host(st.ExecutorURL("A"))},
		{Job: "push-bridge", Addr: bridgeAddr},
	}
	for _, ep := range st.EtcdEndpoints() {
		ts = append(ts, gameday.Target{Job: "etcd", Addr: host(ep)})
	}
	return ts
}
