package benche2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/harness/soak"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

// Modes of a run.
const (
	// ModeSpread spreads Config.Payouts over Config.Accounts accounts.
	ModeSpread = "spread"
	// ModeHot puts Config.HotPayouts payouts on one account.
	ModeHot = "hot"
)

// Defaults of Config (DefaultConfig): the first hand measurement's sizes.
const (
	DefaultPayouts    = 2000
	DefaultAccounts   = 200
	DefaultCreators   = 16
	DefaultExecutors  = 2
	DefaultRuns       = 3
	DefaultHotPayouts = 300
	// DefaultLeaseTTL is the executors' lease TTL: the stack's default.
	DefaultLeaseTTL = stack.DefaultLeaseTTL
)

// ErrInvalidConfig is wrapped by every error of Config.Validate.
var ErrInvalidConfig = errors.New("benche2e: invalid config")

// ErrIntegrity: a run broke an integrity check (soak.Check); the Result
// is returned with every failure in its runs.
var ErrIntegrity = errors.New("benche2e: integrity check failed")

// Config describes a benchmark. Start from DefaultConfig.
type Config struct {
	// Backends are measured in this order (stack.BackendPostgres,
	// stack.BackendEtcd), a fresh stack per run.
	Backends []string
	// Payouts over Accounts accounts, created by Creators concurrent
	// creators, in ModeSpread; HotPayouts on one account in ModeHot.
	Payouts, Accounts, Creators, HotPayouts int
	// Modes are ModeSpread and/or ModeHot. Default both.
	Modes []string
	// Executors is the number of executor processes (default 2, as `go
	// run ./local up`).
	Executors int
	// Runs is the number of runs of each backend, mode and variant.
	Runs int
	// Variants are the settings compared side by side: every variant runs
	// once per round, so the drift of a shared machine hits them alike.
	// Default: one, Current.
	Variants []Variant
	// Seed drives the plan of payouts (soak.Config.Seed); run i uses
	// Seed+i. 0: one is drawn.
	Seed uint64
	// ProfileSeconds > 0 takes a CPU profile of every service process for
	// that many seconds from the start of each run's load.
	ProfileSeconds int
	// Statements counts the statements every database serves during each
	// run and, with the etcd backend, what etcd serves
	// (ObserverConfig.Statements), reported per payout.
	Statements bool
	// LeaseTTL is the executors' lease TTL.
	LeaseTTL time.Duration
	// Dir holds each run's folder (logs, profiles); BinDir prebuilt
	// binaries (stack.Build), required.
	Dir, BinDir string
	// Break, when set, is soak.Config.Break of every run: it may break
	// the records on purpose, and the verdict is then taken on the broken
	// records (to show the benchmark failing).
	Break func(ctx context.Context, st *stack.Stack) error
	// Log receives progress lines. Default: discard.
	Log *slog.Logger
}

// Variant is one setting of the stack under measurement.
type Variant struct {
	// Name labels the variant's runs ("before", "after").
	Name string
	// BinDir, when set, holds the stack's binaries of this variant (built
	// by stack.Build from another commit, e.g. before a change), instead
	// of Config.BinDir.
	BinDir string
	// Apply changes the soak configuration of a run (nil: none).
	Apply func(*soak.Config)
}

// Current is the variant that measures the stack as it is.
var Current = Variant{Name: "current"}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		Backends: []string{stack.BackendPostgres, stack.BackendEtcd}, Payouts: DefaultPayouts, Accounts: DefaultAccounts,
		Creators: DefaultCreators, HotPayouts: DefaultHotPayouts, Modes: []string{ModeSpread, ModeHot},
		Executors: DefaultExecutors, Runs: DefaultRuns, Variants: []Variant{Current}, LeaseTTL: DefaultLeaseTTL,
	}
}

// Validate returns nil or one error per invalid field, joined, each
// wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
	if len(c.Backends) == 0 {
		bad("Backends: want at least one")
	}
	for _, b := range c.Backends {
		if b != stack.BackendPostgres && b != stack.BackendEtcd {
			bad("Backends: %q is not %q or %q", b, stack.BackendPostgres, stack.BackendEtcd)
		}
	}
	if len(c.Modes) == 0 {
		bad("Modes: want at least one")
	}
	for _, m := range c.Modes {
		if m != ModeSpread && m != ModeHot {
			bad("Modes: %q is not %q or %q", m, ModeSpread, ModeHot)
		}
	}
	if c.Payouts < 1 || c.Accounts < 1 || c.Accounts > c.Payouts || c.HotPayouts < 1 {
		bad("Payouts %d, Accounts %d, HotPayouts %d: want Payouts >= 1, 1 <= Accounts <= Payouts, HotPayouts >= 1", c.Payouts, c.Accounts, c.HotPayouts)
	}
	if c.Creators < 1 || c.Executors < 1 || c.Executors > 26 || c.Runs < 1 {
		bad("Creators %d, Executors %d, Runs %d: want Creators >= 1, Executors 1..26, Runs >= 1", c.Creators, c.Executors, c.Runs)
	}
	if len(c.Variants) == 0 {
		bad("Variants: want at least one")
	}
	for i, v := range c.Variants {
		if v.Name == "" || slices.ContainsFunc(c.Variants[:i], func(o Variant) bool { return o.Name == v.Name }) {
			bad("Variants: name %q: want unique non-empty names", v.Name)
		}
	}
	if c.ProfileSeconds < 0 || c.ProfileSeconds > 60 {
		bad("ProfileSeconds %d: want 0..60", c.ProfileSeconds)
	}
	if c.LeaseTTL <= 0 || c.LeaseTTL%time.Millisecond != 0 {
		bad("LeaseTTL %v: want a positive whole number of milliseconds", c.LeaseTTL)
	}
	if c.BinDir == "" || c.Dir == "" {
		bad("Dir %q, BinDir %q: both required", c.Dir, c.BinDir)
	}
	return errors.Join(errs...)
}

// RunResult is one run.
type RunResult struct {
	Backend string `json:"backend"`
	Mode    string `json:"mode"`
	Variant string `json:"variant"`
	// Round is the run's number among the runs of its backend, mode and
	// variant (1..Runs).
	Round    int    `json:"round"`
	Seed     uint64 `json:"seed"`
	Payouts  int    `json:"payouts"`
	Accounts int    `json:"accounts"`
	Creators int    `json:"creators"`
	Dir      string `json:"dir"`
	Measurement
	// Outcomes counts the payouts by final state (soak.Report.Outcomes).
	Outcomes map[string]int `json:"outcomes"`
	// Failures lists every broken integrity check (soak.Check); a run
	// with any fails the benchmark.
	Failures []string `json:"failures"`
}

// Result is every run of a benchmark, written as bench-e2e.json.
type Result struct {
	Started time.Time   `json:"started"`
	Runs    []RunResult `json:"runs"`
}

// Run runs the benchmark: for each round, each backend, each mode and each
// variant, one fresh stack and one soak run without chaos. It returns the
// Result so far and an error when a run could not be carried out, or
// ErrIntegrity (with the Result complete) when a run broke a check.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = quiet
	}
	if cfg.Seed == 0 {
		cfg.Seed = soak.NewSeed()
	}
	res := &Result{Started: time.Now().UTC()}
	var broken []string
	for round := 1; round <= cfg.Runs; round++ {
		for _, backend := range cfg.Backends {
			for _, mode := range cfg.Modes {
				for _, v := range cfg.Variants {
					rr, err := runOne(ctx, cfg, backend, mode, v, round)
					if rr != nil {
						res.Runs = append(res.Runs, *rr)
						for _, f := range rr.Failures {
							broken = append(broken, fmt.Sprintf("%s %s %s round %d: %s", backend, mode, v.Name, round, f))
						}
					}
					if err != nil {
						return res, err
					}
				}
			}
		}
	}
	if len(broken) > 0 {
		return res, fmt.Errorf("%w: %d broken, first: %s", ErrIntegrity, len(broken), broken[0])
	}
	return res, nil
}

func runOne(ctx context.Context, cfg Config, backend, mode string, v Variant, round int) (*RunResult, error) {
	sc := soak.DefaultConfig()
	sc.Backend, sc.NoChaos, sc.EtcdMembers = backend, true, 1
	sc.DuplicateRatio, sc.DeclineRatio = 0, 0
	sc.Executors, sc.CreateWorkers, sc.LeaseTTL = cfg.Executors, cfg.Creators, cfg.LeaseTTL
	sc.Payouts, sc.Accounts = cfg.Payouts, cfg.Accounts
	if mode == ModeHot {
		sc.Payouts, sc.Accounts = cfg.HotPayouts, 1
	}
	sc.Seed = cfg.Seed + uint64(round) - 1
	sc.BinDir, sc.Break = cfg.BinDir, cfg.Break
	sc.Dir = filepath.Join(cfg.Dir, fmt.Sprintf("%s-%s-%s-%d", backend, mode, v.Name, round))
	sc.Pprof = cfg.ProfileSeconds > 0
	sc.StatementStats = cfg.Statements
	sc.Log = slog.New(warnOnly{cfg.Log.Handler()})
	if v.BinDir != "" {
		sc.BinDir = v.BinDir
	}
	if v.Apply != nil {
		v.Apply(&sc)
	}
	rr := &RunResult{Backend: backend, Mode: mode, Variant: v.Name, Round: round, Seed: sc.Seed, Payouts: sc.Payouts,
		Accounts: sc.Accounts, Creators: sc.CreateWorkers, Dir: sc.Dir}
	sc.Observe = Observer(&rr.Measurement, ObserverConfig{ProfileSeconds: cfg.ProfileSeconds, ProfileDir: filepath.Join(sc.Dir, "profiles"),
		Statements: cfg.Statements})
	cfg.Log.Info("bench run starting", "backend", backend, "mode", mode, "variant", v.Name, "round", round, "payouts", sc.Payouts, "accounts", sc.Accounts)
	rep, err := soak.Run(ctx, sc)
	if rep != nil {
		rr.Outcomes = rep.Outcomes
		rr.Failures = rep.Failures
		if sc.Break != nil {
			rr.Failures = rep.FailuresAfterBreak
		}
	}
	if err != nil {
		return rr, fmt.Errorf("%s %s %s round %d: %w", backend, mode, v.Name, round, err)
	}
	if rr.Failures == nil {
		rr.Failures = []string{}
	}
	cfg.Log.Info("bench run done", "backend", backend, "mode", mode, "variant", v.Name, "round", round,
		"payoutsPerSecond", rr.PayoutsPerSecond, "p50ms", rr.LatencyMs["p50"], "outboxLagP50ms", rr.OutboxLagMs["p50"], "cpuPerPayoutMs", rr.CPUPerPayoutMs["total"],
		"deliveries", rr.Deliveries, "failures", len(rr.Failures), "load", rr.LoadBefore)
	return rr, nil
}

// warnOnly passes on records at WARN and above (the soak's own progress
// lines stay out of the benchmark's output).
type warnOnly struct{ slog.Handler }

func (h warnOnly) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && h.Handler.Enabled(ctx, l)
}

func (h warnOnly) WithAttrs(as []slog.Attr) slog.Handler { return warnOnly{h.Handler.WithAttrs(as)} }
func (h warnOnly) WithGroup(name string) slog.Handler    { return warnOnly{h.Handler.WithGroup(name)} }

// WriteJSON writes res, indented.
func WriteJSON(w io.Writer, res *Result) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// WriteMarkdown writes one table row per backend, mode and variant: the
// median of its runs' payouts/s, latency percentiles and CPU per payout,
// the deliveries of each executor summed over the runs, the load average
// and the number of broken checks; then the median CPU per payout of
// each process; then, when the runs counted them, the statements per
// payout of each database, the most frequent statements and etcd's
// requests and disk flushes per payout.
func WriteMarkdown(w io.Writer, res *Result) error {
	type key struct{ backend, mode, variant string }
	var keys []key
	groups := map[key][]RunResult{}
	for _, r := range res.Runs {
		k := key{r.Backend, r.Mode, r.Variant}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], r)
	}
	var b strings.Builder
	b.WriteString("| backend | mode | variant | runs | payouts/s (each run) | p50 ms | p95 ms | p99 ms | outbox lag p50/p99 ms | CPU ms/payout | deliveries per executor | load avg | broken checks |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, k := range keys {
		rs := groups[k]
		var rates []string
		var broken int
		del := map[string]int{}
		for _, r := range rs {
			rates = append(rates, fmt.Sprintf("%.1f", r.PayoutsPerSecond))
			broken += len(r.Failures)
			for e, n := range r.Deliveries {
				del[e] += n
			}
		}
		var ds []string
		for _, e := range slices.Sorted(mapsKeys(del)) {
			ds = append(ds, fmt.Sprintf("%s %d", e, del[e]))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %d | %.1f (%s) | %.0f | %.0f | %.0f | %.0f/%.0f | %.2f | %s | %.1f-%.1f | %d |\n",
			k.backend, k.mode, k.variant, len(rs), median(rs, func(r RunResult) float64 { return r.PayoutsPerSecond }), strings.Join(rates, ", "),
			median(rs, func(r RunResult) float64 { return r.LatencyMs["p50"] }), median(rs, func(r RunResult) float64 { return r.LatencyMs["p95"] }),
			median(rs, func(r RunResult) float64 { return r.LatencyMs["p99"] }),
			median(rs, func(r RunResult) float64 { return r.OutboxLagMs["p50"] }), median(rs, func(r RunResult) float64 { return r.OutboxLagMs["p99"] }),
			median(rs, func(r RunResult) float64 { return r.CPUPerPayoutMs["total"] }),
			strings.Join(ds, ", "), minOf(rs, func(r RunResult) float64 { return r.LoadBefore }), maxOf(rs, func(r RunResult) float64 { return r.LoadAfter }), broken)
	}
	b.WriteString("\nCPU per payout (ms, median of the runs) by process:\n\n")
	procs := map[string]bool{}
	for _, r := range res.Runs {
		for p := range r.CPUPerPayoutMs {
			procs[p] = true
		}
	}
	names := slices.Sorted(mapsKeys(procs))
	b.WriteString("| backend | mode | variant | " + strings.Join(names, " | ") + " |\n|---|---|---|" + strings.Repeat("---|", len(names)) + "\n")
	for _, k := range keys {
		rs := groups[k]
		fmt.Fprintf(&b, "| %s | %s | %s |", k.backend, k.mode, k.variant)
		for _, p := range names {
			fmt.Fprintf(&b, " %.2f |", median(rs, func(r RunResult) float64 { return r.CPUPerPayoutMs[p] }))
		}
		b.WriteString("\n")
	}
	writeStatements(&b, keys, groups)
	writeEtcd(&b, keys, groups)
	writeRequests(&b, keys, groups)
	for _, k := range keys {
		// The cost model from the first spread run of each backend
		// (this tree's, when a "before" variant ran beside it).
		if r := groups[k][0]; k.mode == "spread" && k.variant != "before" && len(r.RequestsPerPayout) > 0 {
			if err := WriteCost(&b, k.backend, Cost(r.Measurement, k.backend, DefaultShape(), DefaultPrices()), DefaultPrices()); err != nil {
				return err
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeRequests adds the median HTTP requests per payout of each service
// and route, one column per backend, mode and variant.
func writeRequests[K comparable](b *strings.Builder, keys []K, groups map[K][]RunResult) {
	routes := map[string]bool{}
	for _, rs := range groups {
		for _, r := range rs {
			for k := range r.RequestsPerPayout {
				routes[k] = true
			}
		}
	}
	if len(routes) == 0 {
		return
	}
	delete(routes, "total")
	names := append(slices.Sorted(mapsKeys(routes)), "total")
	b.WriteString("\nHTTP requests per payout by service and route (median of the runs; the creators' and the push bridge's requests are the services' answers to them):\n\n| service route |")
	for _, k := range keys {
		r0 := groups[k][0]
		fmt.Fprintf(b, " %s %s %s |", r0.Backend, r0.Mode, r0.Variant)
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(keys)) + "\n")
	for _, name := range names {
		fmt.Fprintf(b, "| %s |", name)
		for _, k := range keys {
			fmt.Fprintf(b, " %.2f |", median(groups[k], func(r RunResult) float64 { return r.RequestsPerPayout[name] }))
		}
		b.WriteString("\n")
	}
}

// writeEtcd adds, when the runs read etcd's metrics, the median of each
// row of EtcdPerPayout, one column per backend, mode and variant that has
// them.
func writeEtcd[K comparable](b *strings.Builder, keys []K, groups map[K][]RunResult) {
	var cols []K
	methods := map[string]bool{}
	for _, k := range keys {
		if len(groups[k][0].EtcdPerPayout) == 0 {
			continue
		}
		cols = append(cols, k)
		for _, r := range groups[k] {
			for row := range r.EtcdPerPayout {
				if strings.HasPrefix(row, "grpc ") && row != etcdGRPCTotal {
					methods[row] = true
				}
			}
		}
	}
	if len(cols) == 0 {
		return
	}
	b.WriteString("\netcd per payout (median of the runs; etcd's own metrics: gRPC requests by method summed over the members, the rows from \"keys put\" on the leader's):\n\n| etcd |")
	for _, k := range cols {
		r0 := groups[k][0]
		fmt.Fprintf(b, " %s %s %s |", r0.Backend, r0.Mode, r0.Variant)
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(cols)) + "\n")
	for _, row := range append(slices.Sorted(mapsKeys(methods)), etcdRowOrder...) {
		fmt.Fprintf(b, "| %s |", row)
		for _, k := range cols {
			fmt.Fprintf(b, " %.2f |", median(groups[k], func(r RunResult) float64 { return r.EtcdPerPayout[row] }))
		}
		b.WriteString("\n")
	}
}

// topStatements is how many statements of each database
// writeStatements lists.
const topStatements = 12

// writeStatements adds, when the runs counted statements, the median
// statements per payout of each database, then each database's most
// frequent statements in the first run of each backend, mode and variant.
func writeStatements[K comparable](b *strings.Builder, keys []K, groups map[K][]RunResult) {
	dbs := map[string]bool{}
	for _, rs := range groups {
		for _, r := range rs {
			for db := range r.StatementsPerPayout {
				dbs[db] = true
			}
		}
	}
	if len(dbs) == 0 {
		return
	}
	delete(dbs, "total")
	names := append(slices.Sorted(mapsKeys(dbs)), "total")
	b.WriteString("\nStatements per payout by database (median of the runs; pg_stat_statements, BEGIN and COMMIT included):\n\n")
	b.WriteString("| backend | mode | variant | " + strings.Join(names, " | ") + " |\n|---|---|---|" + strings.Repeat("---|", len(names)) + "\n")
	for _, k := range keys {
		rs := groups[k]
		r0 := rs[0]
		fmt.Fprintf(b, "| %s | %s | %s |", r0.Backend, r0.Mode, r0.Variant)
		for _, db := range names {
			fmt.Fprintf(b, " %.2f |", median(rs, func(r RunResult) float64 { return r.StatementsPerPayout[db] }))
		}
		b.WriteString("\n")
	}
	for _, k := range keys {
		r := groups[k][0]
		if len(r.Statements) == 0 || r.Payouts == 0 {
			continue
		}
		fmt.Fprintf(b, "\nMost frequent statements, %s %s %s, round %d (%d payouts):\n\n", r.Backend, r.Mode, r.Variant, r.Round, r.Measurement.Payouts)
		b.WriteString("| database | per payout | mean µs | statement |\n|---|---|---|---|\n")
		shown := map[string]int{}
		for _, s := range r.Statements {
			if shown[s.Database] == topStatements {
				continue
			}
			shown[s.Database]++
			q := s.Query
			if len(q) > 100 {
				q = q[:100] + "..."
			}
			fmt.Fprintf(b, "| %s | %.2f | %.0f | `%s` |\n", s.Database, float64(s.Calls)/float64(r.Measurement.Payouts),
				1000*s.TotalMs/float64(max(s.Calls, 1)), strings.ReplaceAll(q, "|", "\\|"))
		}
	}
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func median(rs []RunResult, f func(RunResult) float64) float64 {
	xs := make([]float64, len(rs))
	for i, r := range rs {
		xs[i] = f(r)
	}
	slices.Sort(xs)
	if len(xs) == 0 {
		return 0
	}
	if len(xs)%2 == 1 {
		return xs[len(xs)/2]
	}
	return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
}

func minOf(rs []RunResult, f func(RunResult) float64) float64 {
	m := math.Inf(1)
	for _, r := range rs {
		m = min(m, f(r))
	}
	return m
}

func maxOf(rs []RunResult, f func(RunResult) float64) float64 {
	m := math.Inf(-1)
	for _, r := range rs {
		m = max(m, f(r))
	}
	return m
}
