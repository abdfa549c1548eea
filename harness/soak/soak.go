// Package soak is the crash soak of the payout pipeline: many payouts
// through the local stack while every kind of process is killed with
// SIGKILL and restarted at seeded moments (Run), then judged from the
// records (Check: none lost, none paid twice, the ledger balances, one
// debit per rail payment). One seed drives the plan and the kills. Run it
// with `make soak` or ./harness/cmd/soak; docs/reliability.md has the
// design and the runs.
package soak

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/distributed-lock-lab/distributed-lock-lab/harness/drive"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

// Defaults of Config (DefaultConfig).
const (
	// DefaultPayouts is the number of payouts of a full soak.
	DefaultPayouts = 10_000
	// DefaultAccounts is the number of accounts they are spread over.
	DefaultAccounts = 200
	// DefaultExecutors is the number of executor processes.
	DefaultExecutors = 3
	// DefaultCreateWorkers is the number of concurrent payout creations.
	DefaultCreateWorkers = 4
	// DefaultDuplicateRatio is the share of payouts whose event is
	// published a second time.
	DefaultDuplicateRatio = 0.2
	// DefaultDeclineRatio is the share of payouts above the rail-stub's
	// decline threshold (railstub.DefaultDeclineOverMinor): the rail
	// declines them.
	DefaultDeclineRatio = 0.05
	// DefaultKillGap is the mean gap between two kills; each gap is drawn
	// uniformly from [KillGap/2, 3·KillGap/2].
	DefaultKillGap = 2 * time.Second
	// DefaultDownTime bounds how long a killed part stays down before its
	// supervisor restarts it; each is drawn uniformly from [0, DownTime].
	DefaultDownTime = 500 * time.Millisecond
	// DefaultLeaseTTL is the executors' lease TTL: short, so that the
	// lease of a killed executor ends soon and another worker goes on.
	DefaultLeaseTTL = 3 * time.Second
	// DefaultReconcileEvery is the reconciler process's period during the
	// load (the settle phase triggers passes itself).
	DefaultReconcileEvery = 3 * time.Second
	// DefaultSettleTimeout bounds the drain and the reconciliation after
	// the load. A full run on a saturated machine can end its load with a
	// backlog of a thousand payouts still queued (4 minutes were too few
	// for one such etcd run; see docs/reliability.md).
	DefaultSettleTimeout = 10 * time.Minute
	// DefaultStallTimeout is how long the drain waits without any payout
	// finishing before it re-publishes the events of the payouts still
	// waiting (an operator's redrive of dead-lettered messages).
	DefaultStallTimeout = 40 * time.Second
	// DefaultBucket is the width of a throughput bucket.
	DefaultBucket = time.Second
	// OpeningBalanceMinor is every account's opening balance.
	OpeningBalanceMinor = 1_000_000_000_000
	// Currency of every account and payout.
	Currency = "EUR"
)

// Errors of this package; test them with errors.Is.
var (
	// ErrInvalidConfig: a Config field is out of range.
	ErrInvalidConfig = errors.New("soak: invalid config")
	// ErrProcessExited: a process of the stack exited that the chaos had
	// not killed (or one it restarted exited again); the message names it,
	// with its exit status and the last lines of its log.
	ErrProcessExited = errors.New("soak: a process exited on its own")
	// ErrNotSettled: the pipeline did not settle within
	// Config.SettleTimeout (payouts still pending, claimed, ambiguous or
	// forwarding): reported with the counts, and the Report is still
	// returned so that the records can be read.
	ErrNotSettled = errors.New("soak: the pipeline did not settle")
)

// Config describes one soak run. Start from DefaultConfig.
type Config struct {
	// Backend is lock-server's backend: stack.BackendPostgres or
	// stack.BackendEtcd (three etcd members, one process each).
	Backend string
	// Payouts is the number of payouts, >= 1. Default DefaultPayouts.
	Payouts int
	// Accounts is the number of accounts, 1..Payouts. Default
	// DefaultAccounts.
	Accounts int
	// Executors is the number of executor processes, 1..26. Default
	// DefaultExecutors.
	Executors int
	// CreateWorkers is the number of concurrent payout creations.
	CreateWorkers int
	// Rate paces the creations, in payouts per second; 0 creates them as
	// fast as CreateWorkers go.
	Rate float64
	// DuplicateRatio and DeclineRatio are shares in [0, 1] (see the
	// defaults).
	DuplicateRatio, DeclineRatio float64
	// Seed drives the plan and the chaos. 0: one is drawn and reported.
	Seed uint64
	// KillGap is the mean gap between kills (> 0); DownTime bounds each
	// part's time down (>= 0).
	KillGap, DownTime time.Duration
	// Rounds is the minimum number of rounds of kills (each round kills
	// every kind of part once, in a seeded order); kills go on, round
	// after round, until every payout has been created. Default 1.
	Rounds int
	// MaxRounds, when positive, stops the kills after that many rounds
	// even if payouts are still being created (the short soak in CI:
	// exactly one kill of each kind). Default 0: no bound.
	MaxRounds int
	// NoChaos runs the load without any fault (a baseline).
	NoChaos bool
	// Faults are the kinds of fault drawn (FaultsKill, FaultsNet), each
	// by a driver of its own, side by side. Default (DefaultConfig):
	// kills only. FaultsNet starts the stack with links
	// (stack.Config.Links).
	Faults []string
	// NetHold is the mean time a network fault stays (> 0 with
	// FaultsNet). Default DefaultNetHold.
	NetHold time.Duration
	// LeaseTTL is the executors' lease TTL. Default DefaultLeaseTTL.
	LeaseTTL time.Duration
	// ReconcileEvery is the reconciler process's period during the load.
	ReconcileEvery time.Duration
	// SettleTimeout and StallTimeout: see the defaults.
	SettleTimeout, StallTimeout time.Duration
	// Bucket is the width of a throughput bucket.
	Bucket time.Duration
	// PaymentFencing and RailFencing are the stack's kill switches
	// (DefaultConfig: both on). Off only to show the checks failing.
	PaymentFencing, RailFencing bool
	// Dir is the stack's run folder (logs, rail journal). Default: a new
	// temporary folder, kept.
	Dir string
	// BinDir holds prebuilt binaries (stack.Build). Default: those of
	// stack.CachedBinaries.
	BinDir string
	// Break, when set, runs after the records have been read and judged
	// (Report.Failures); it may break the records on purpose, through the
	// parts' own interfaces, and they are then read and judged again
	// (Report.FailuresAfterBreak). The short soak uses it to show every
	// check failing on the records of a real run.
	Break func(ctx context.Context, st *stack.Stack) error
	// Observe, when set, is called once the accounts exist and just
	// before the first payout is created; the function it returns is
	// called once the run has settled, before the records are read and
	// while the stack still runs. The end-to-end benchmark
	// (harness/benche2e) measures CPU, deliveries and latency with it.
	Observe func(ctx context.Context, st *stack.Stack) (done func(ctx context.Context) error, err error)
	// Pprof serves Go's profiler from every service process
	// (stack.Config.Pprof). Default false.
	Pprof bool
	// MaxProcs is stack.Config.MaxProcs. Default 0.
	MaxProcs int
	// StatementStats loads pg_stat_statements into the stack's PostgreSQL
	// clusters (stack.Config.StatementStats), for Observe to read.
	// Default false.
	StatementStats bool
	// EtcdMembers is the size of the etcd cluster with the etcd backend:
	// 3 (DefaultConfig: the chaos kills one member, the leader first) or 1
	// (only with NoChaos: the default of `go run ./local up`).
	EtcdMembers int
	// Log receives progress lines (seed, kills, phases). Default: discard.
	Log *slog.Logger
}

// DefaultConfig returns the defaults documented on Config, with the
// postgres backend and both fence points on.
func DefaultConfig() Config {
	return Config{
		Backend: stack.BackendPostgres, Payouts: DefaultPayouts, Accounts: DefaultAccounts, Executors: DefaultExecutors,
		CreateWorkers: DefaultCreateWorkers, DuplicateRatio: DefaultDuplicateRatio, DeclineRatio: DefaultDeclineRatio,
		KillGap: DefaultKillGap, DownTime: DefaultDownTime, Rounds: 1, LeaseTTL: DefaultLeaseTTL,
		ReconcileEvery: DefaultReconcileEvery, SettleTimeout: DefaultSettleTimeout, StallTimeout: DefaultStallTimeout,
		Bucket: DefaultBucket, PaymentFencing: true, RailFencing: true, EtcdMembers: 3,
		Faults: []string{FaultsKill}, NetHold: DefaultNetHold,
	}
}

// Validate returns nil or one error per invalid field, joined, each
// wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
	if c.Backend != stack.BackendPostgres && c.Backend != stack.BackendEtcd {
		bad("Backend %q: want %q or %q", c.Backend, stack.BackendPostgres, stack.BackendEtcd)
	}
	if c.Payouts < 1 {
		bad("Payouts %d: want >= 1", c.Payouts)
	}
	if c.Accounts < 1 || c.Accounts > max(c.Payouts, 1) {
		bad("Accounts %d: want 1..Payouts (%d)", c.Accounts, c.Payouts)
	}
	if c.Executors < 1 || c.Executors > 26 {
		bad("Executors %d: want 1..26", c.Executors)
	}
	if c.CreateWorkers < 1 {
		bad("CreateWorkers %d: want >= 1", c.CreateWorkers)
	}
	if c.Rate < 0 {
		bad("Rate %v: want >= 0", c.Rate)
	}
	for name, r := range map[string]float64{"DuplicateRatio": c.DuplicateRatio, "DeclineRatio": c.DeclineRatio} {
		if r < 0 || r > 1 {
			bad("%s %v: want 0..1", name, r)
		}
	}
	if c.KillGap <= 0 || c.DownTime < 0 {
		bad("KillGap %v, DownTime %v: want KillGap > 0, DownTime >= 0", c.KillGap, c.DownTime)
	}
	if c.Rounds < 1 || c.MaxRounds < 0 || c.MaxRounds > 0 && c.MaxRounds < c.Rounds {
		bad("Rounds %d, MaxRounds %d: want Rounds >= 1 and MaxRounds 0 or >= Rounds", c.Rounds, c.MaxRounds)
	}
	for _, f := range c.Faults {
		if f != FaultsKill && f != FaultsNet {
			bad("Faults %q: want %q or %q", f, FaultsKill, FaultsNet)
		}
	}
	if slices.Contains(c.Faults, FaultsNet) && c.NetHold <= 0 {
		bad("NetHold %v: want > 0 with network faults", c.NetHold)
	}
	if c.EtcdMembers != 3 && (c.EtcdMembers != 1 || !c.NoChaos) {
		bad("EtcdMembers %d: want 3, or 1 with NoChaos", c.EtcdMembers)
	}
	if c.LeaseTTL <= 0 || c.LeaseTTL%time.Millisecond != 0 {
		bad("LeaseTTL %v: want a positive whole number of milliseconds", c.LeaseTTL)
	}
	if c.ReconcileEvery <= 0 || c.SettleTimeout <= 0 || c.StallTimeout <= 0 || c.Bucket <= 0 {
		bad("ReconcileEvery %v, SettleTimeout %v, StallTimeout %v, Bucket %v: want all > 0", c.ReconcileEvery, c.SettleTimeout, c.StallTimeout, c.Bucket)
	}
	return errors.Join(errs...)
}

// Run runs one soak and returns its Report. The error is for a run that
// could not be carried out (the stack did not start, a killed part did not
// come back, a process exited on its own: ErrProcessExited, the pipeline
// did not settle: ErrNotSettled, with the Report filled as far as it got);
// once the stack has started it names the seed and the run folder.
// Broken invariants are in Report.Failures, with a nil error.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Seed == 0 {
		cfg.Seed = NewSeed()
	}
	log := cfg.Log.With("backend", cfg.Backend)
	// The stack and the push bridges log a line per process and per
	// delivery: only their warnings reach cfg.Log.
	quiet := slog.New(minLevel{cfg.Log.Handler(), slog.LevelWarn}).With("backend", cfg.Backend)
	log.Info("soak starting", "seed", cfg.Seed, "payouts", cfg.Payouts, "accounts", cfg.Accounts, "executors", cfg.Executors)
	rep := &Report{Backend: cfg.Backend, Seed: cfg.Seed, Payouts: cfg.Payouts, Accounts: cfg.Accounts, Executors: cfg.Executors,
		PaymentFencing: cfg.PaymentFencing, RailFencing: cfg.RailFencing, Kills: []Kill{}, NetFaults: []NetFault{}, Failures: []string{}}

	scfg := stack.Config{Backend: cfg.Backend, PaymentFencing: cfg.PaymentFencing, RailFencing: cfg.RailFencing,
		ReconcileEvery: cfg.ReconcileEvery, Dir: cfg.Dir, BinDir: cfg.BinDir, LeaseTTL: cfg.LeaseTTL, Log: quiet,
		RailJournal: true, Pprof: cfg.Pprof, StatementStats: cfg.StatementStats, MaxProcs: cfg.MaxProcs,
		Links: !cfg.NoChaos && slices.Contains(cfg.Faults, FaultsNet)}
	if cfg.Backend == stack.BackendEtcd {
		scfg.EtcdMembers = cfg.EtcdMembers
	}
	for i := range cfg.Executors {
		scfg.Executors = append(scfg.Executors, stack.ExecutorSpec{Name: string(rune('A' + i))})
	}
	t0 := time.Now()
	d, err := drive.Start(ctx, scfg)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	st := d.Stack()
	rep.Dir = st.Dir()
	log.Info("stack ready", "took", time.Since(t0).Round(time.Millisecond), "dir", st.Dir())
	ctx, stopWatch := watchExits(ctx, st.Exited())
	defer stopWatch()
	// fail names the seed and the run folder, and prefers a process's exit
	// (which ended ctx) to what it made fail.
	fail := func(err error) error {
		if cause := context.Cause(ctx); errors.Is(cause, ErrProcessExited) {
			err = cause
		}
		return fmt.Errorf("soak (seed %d, logs in %s): %w", cfg.Seed, st.Dir(), err)
	}
	stopPush, err := st.Push(ctx, quiet)
	if err != nil {
		return nil, fail(err)
	}
	defer stopPush()

	ld := &loader{cfg: cfg, plan: newPlan(cfg), d: d}
	if err := ld.createAccounts(ctx); err != nil {
		return nil, fail(err)
	}
	if err := checkpoint(ctx, st); err != nil {
		return nil, fail(err)
	}

	var observed func(context.Context) error
	if cfg.Observe != nil {
		if observed, err = cfg.Observe(ctx, st); err != nil {
			return nil, fail(fmt.Errorf("observe: %w", err))
		}
	}
	rep.Start = time.Now()
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	created := make(chan struct{})
	var (
		wg       sync.WaitGroup
		loadErr  error
		chaosErr error
		netErr   error
	)
	wg.Go(func() {
		defer close(created)
		if loadErr = ld.createPayouts(runCtx); loadErr != nil {
			cancelRun()
		}
	})
	if !cfg.NoChaos && slices.Contains(cfg.Faults, FaultsNet) {
		nc := newNetChaos(cfg, st, log)
		wg.Go(func() {
			var err error
			if rep.NetFaults, err = nc.run(runCtx, created); err != nil {
				netErr = fmt.Errorf("network faults: %w", err)
				cancelRun()
			}
		})
	}
	if !cfg.NoChaos && (cfg.Faults == nil || slices.Contains(cfg.Faults, FaultsKill)) {
		ch := newChaos(cfg, st, log)
		wg.Go(func() {
			rep.Kills, chaosErr = ch.run(runCtx, created)
			if chaosErr != nil {
				cancelRun()
			}
		})
	}
	wg.Wait()
	rep.LoadEnd = time.Now()
	rep.Duplicates = ld.duplicates()
	if err := errors.Join(loadErr, chaosErr, netErr); err != nil {
		return rep, fail(err)
	}
	log.Info("load done; settling", "took", rep.LoadEnd.Sub(rep.Start).Round(time.Millisecond), "kills", len(rep.Kills), "netFaults", len(rep.NetFaults))

	settleErr := settle(ctx, cfg, ld, rep, log)
	rep.SettledAt = time.Now()
	rep.Settled = settleErr == nil
	if settleErr != nil && !errors.Is(settleErr, ErrNotSettled) {
		return rep, fail(settleErr)
	}
	if observed != nil {
		if err := observed(ctx); err != nil {
			return rep, fail(errors.Join(fmt.Errorf("observe's end: %w", err), settleErr))
		}
	}
	recs, err := readRecords(ctx, ld)
	if err != nil {
		return rep, fail(fmt.Errorf("read the records: %w", err))
	}
	rep.fill(recs, cfg.Bucket)
	rep.Failures = Check(recs)
	if cfg.Break != nil {
		if err := cfg.Break(ctx, st); err != nil {
			return rep, fail(fmt.Errorf("break: %w", err))
		}
		broken, err := readRecords(ctx, ld)
		if err != nil {
			return rep, fail(fmt.Errorf("read the broken records: %w", err))
		}
		rep.FailuresAfterBreak = Check(broken)
	}
	log.Info("soak done", "seed", cfg.Seed, "outcomes", rep.Outcomes, "failures", len(rep.Failures))
	if settleErr != nil {
		return rep, fail(settleErr)
	}
	if err := context.Cause(ctx); errors.Is(err, ErrProcessExited) {
		return rep, fail(err)
	}
	return rep, nil
}

// executorName returns the process name of executor i.
func executorName(i int) string { return "executor-" + string(rune('A'+i)) }

// payoutID returns the id of payout i of a run.
func payoutID(i int) string { return "soak-" + strconv.Itoa(i+1) }

// NewSeed draws a seed for a run (never 0).
func NewSeed() uint64 {
	for {
		if s := rand.Uint64(); s != 0 {
			return s
		}
	}
}

// minLevel is a slog.Handler that passes on records at min or above.
type minLevel struct {
	slog.Handler
	min slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(as []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(as), h.min}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h.Handler.WithGroup(name), h.min}
}

// watchExits returns a context that ends, with a cause wrapping
// ErrProcessExited, when exited (stack.Stack.Exited: the chaos's kills
// and the stack's stop are not reported, a restarted process is covered
// once ready) reports a process, and a function that ends the watch.
func watchExits(ctx context.Context, exited <-chan stack.ProcessExit) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	// Ends with ctx (the returned function ends it), at the latest once it
	// has reported an exit.
	go func() {
		select {
		case e := <-exited:
			cancel(fmt.Errorf("%w: %s (pid %d, %v); last lines of %s:\n%s", ErrProcessExited, e.Name, e.PID, e.Err, e.LogPath, e.LogTail))
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(nil) }
}

// checkpoint runs CHECKPOINT on the stack's PostgreSQL clusters once the
// services have created their tables: a server that has run for a while
// has checkpointed (checkpoint_timeout, 5 min by default), so its crash
// recovery replays minutes of WAL, not the whole setup of a new cluster
// (which made each restart of a fresh cluster seconds longer).
func checkpoint(ctx context.Context, st *stack.Stack) error {
	for _, dsn := range []string{st.PayDBURL(), st.LockDBURL()} {
		if dsn == "" {
			continue
		}
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return fmt.Errorf("soak: checkpoint: %w", err)
		}
		_, err = conn.Exec(ctx, "CHECKPOINT")
		conn.Close(ctx)
		if err != nil {
			return fmt.Errorf("soak: checkpoint: %w", err)
		}
	}
	return nil
}
