// Package stack starts the whole payout system on this machine as separate
// operating-system processes on loopback, so that the fencing experiment
// can stop a worker with a real SIGSTOP: throwaway PostgreSQL clusters
// (paydb and raildb; lockdb apart), etcd and the Pub/Sub fake in processes
// of their own, lock-server, rail-stub, rail-proxy, payment-resource and
// the executors of Config.Executors.
//
// Start(ctx, cfg) returns once every service answers ready; Stop ends every
// child and removes the clusters' and etcd's data. Ports come from the
// operating system; each process logs to its own file in Config.Dir and
// dies with the program that started it. With Config.Links every path
// between two processes goes through a link (Link), where a caller can
// inject network faults. A laboratory: trust authentication, no TLS, kill
// switches that may be off.
package stack

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor/fault"
	payapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutbus"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/reconciler"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgcluster"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pprofserve"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/link"
	lockapi "github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/config"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
)

// Backends accepted in Config.Backend.
const (
	// BackendPostgres makes lock-server keep leases in lockdb.
	BackendPostgres = "postgres"
	// BackendEtcd makes lock-server keep leases in etcd.
	BackendEtcd = "etcd"
)

// Pub/Sub names of the stack.
const (
	// PubSubProject is the project id every client of the fake uses.
	PubSubProject = "local"
	// PubSubTopic carries payout events from payment-resource.
	PubSubTopic = "payouts"
	// PubSubSubscription is the pull subscription payment-resource creates
	// at start; the harness pulls from it and pushes to the executors.
	PubSubSubscription = "payout-executor"
)

// Defaults of Config.
const (
	// DefaultLeaseTTL is the executors' lease TTL when Config.LeaseTTL is 0:
	// the executor's own default.
	DefaultLeaseTTL = 10 * time.Second
	// DefaultStartTimeout bounds Start, after the binaries are built, when
	// the caller's ctx has no sooner deadline: databases, Pub/Sub, the
	// services and their readiness. The build itself is bounded by ctx
	// alone (a first build compiles every dependency).
	DefaultStartTimeout = 3 * time.Minute
	// stopGrace is how long Stop waits for a process after SIGTERM before
	// it kills the process group.
	stopGrace = 10 * time.Second
	// pollInterval is the pause between readiness probes.
	pollInterval = 20 * time.Millisecond
	// portAttempts bounds the retries of a service whose port was taken
	// between the probe and its bind.
	portAttempts = 3
)

// Errors of Start; test them with errors.Is.
var (
	// ErrPrerequisite: something the stack needs on this machine is
	// missing (the go command, the PostgreSQL binaries).
	ErrPrerequisite = errors.New("stack: missing prerequisite")
	// ErrInterrupted: the context of Start or Build ended (Ctrl-C) before
	// it finished; what it had started is stopped.
	ErrInterrupted = errors.New("stack: interrupted")
	// ErrExited: a process exited while the stack was starting; the message
	// carries the tail of its log.
	ErrExited = errors.New("stack: process exited during start")
	// ErrInvalidConfig: a Config field is not valid.
	ErrInvalidConfig = errors.New("stack: invalid config")
)

// ExecutorSpec describes one executor process.
type ExecutorSpec struct {
	// Name is the executor's owner id (EXECUTOR_ID), e.g. "A". Required,
	// unique within a stack.
	Name string
	// SelfStopBefore, when set to a payout id, makes the executor SIGSTOP
	// itself once, after its last lease confirmation and before the rail
	// submission of that payout (EXECUTOR_SELF_STOP_BEFORE_SUBMIT). Default
	// "": never.
	SelfStopBefore string
}

// Config describes a Stack. Start does not modify it.
type Config struct {
	// Backend is lock-server's LOCK_STORE: BackendPostgres or BackendEtcd.
	// Default BackendPostgres.
	Backend string
	// PaymentFencing and RailFencing are the two kill switches
	// (PAYMENT_FENCING_ENABLED, RAIL_PROXY_FENCING_ENABLED). The zero value
	// is off for both: callers say which fences they want. Off is a hazard
	// outside the fencing experiment.
	PaymentFencing, RailFencing bool
	// Executors are started in order, one process each.
	Executors []ExecutorSpec
	// ReconcileEvery, when positive, starts the reconciler as a process
	// (functions/cmd/reconciler) that runs a pass every that long
	// (RECONCILER_INTERVAL_MS) and audits the three records after each.
	// Default 0: no reconciler.
	ReconcileEvery time.Duration
	// Dir is the run folder: one log file per process. It is created if
	// missing and kept after Stop. Default: a new directory under
	// os.TempDir().
	Dir string
	// BinDir holds prebuilt binaries (see Build). Default "": those of
	// CachedBinaries, built first if the sources changed.
	BinDir string
	// LeaseTTL is the executors' lease TTL (LEASE_TTL_MS), a whole number
	// of milliseconds. Default DefaultLeaseTTL.
	LeaseTTL time.Duration
	// PushTimeout is how long a push bridge (Push) waits for an
	// executor's answer before the delivery counts as failed and the
	// message is redelivered. Default payoutbus.DefaultPushTimeout, the
	// ack deadline of the cloud's push subscription (120 s); shorter makes
	// a frozen executor's payout reach another one sooner.
	PushTimeout time.Duration
	// PushRetry is the push bridges' redelivery backoff. Default (zero)
	// the package's PushRetry, scaled down 50 times; CloudPushRetry is
	// the subscription's own, for a run whose faults last as long as on
	// Google Cloud.
	PushRetry payoutbus.RetryPolicy
	// PubSub selects the Pub/Sub server: PubSubFake (default: pstest in a
	// process of its own, local/cmd/pubsub-fake) or PubSubEmulator (gcloud's
	// Pub/Sub emulator, which needs gcloud and Java on the PATH).
	PubSub string
	// RailJournal makes the rail-stub keep its record of submissions in a
	// file of the run folder (rail-stub.journal.jsonl, RAIL_STUB_JOURNAL),
	// so that the record survives a restart of the rail-stub (Kill,
	// Restart). Default false: in memory, as the fencing experiment's
	// fixtures expect.
	RailJournal bool
	// EtcdMembers is the size of the etcd cluster with the etcd backend:
	// 1 (the default) runs it in one etcd-local process named "etcd"; 3
	// runs one etcd-local process per member, named "etcd-0", "etcd-1",
	// "etcd-2", so that a chaos experiment can kill one member (Kill) and
	// bring it back (Restart).
	EtcdMembers int
	// Pprof serves Go's profiler from lock-server and every function
	// process (PPROF_ADDR, internal/pprofserve) on a free loopback port of
	// its own, never the service's port; PprofAddrs reports them. Default
	// false: off, as in a deployment.
	Pprof bool
	// StatementStats loads pg_stat_statements into every PostgreSQL
	// cluster (statements.go), so that StatementStats reports the
	// statements each database served: the round trips of the services to
	// their databases. Default false: off, as in a deployment.
	StatementStats bool
	// MaxProcs is the GOMAXPROCS of lock-server and every function
	// process: 0 (the default) is ServiceMaxProcs unless the environment
	// sets GOMAXPROCS; GoDefaultMaxProcs leaves it to Go, as stacks before
	// ServiceMaxProcs did (a benchmark's "before" variant runs that way).
	MaxProcs int
	// Links puts a link (package local/link: a proxy in this process) on
	// every path between two processes of the stack: each executor to
	// lock-server, payment-resource and rail-proxy; rail-proxy to the
	// rail-stub and to raildb; lock-server to lockdb or etcd;
	// payment-resource to paydb; the push bridge to each executor. Link
	// returns one by name to inject a network fault. The harness's own
	// clients (Driver, the reconciler, the audit) go direct. Default
	// false: no links, every process dials the other.
	Links bool
	// LogLevel is the LOG_LEVEL of lock-server and every function process:
	// debug, info, warn or error. Default "": the processes' own default
	// (info), unless the environment sets LOG_LEVEL. The fencing experiment
	// runs at debug: its story is told by the per-step lines that are
	// DEBUG in a deployment (docs/log-events.md).
	LogLevel string
	// Log receives one line per process started and stopped. Default:
	// discard.
	Log *slog.Logger
}

// Pub/Sub servers a stack can run.
const (
	PubSubFake     = "fake"
	PubSubEmulator = "emulator"
)

// Validate returns nil or one error per invalid field, joined
// (errors.Join), each wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
	switch c.Backend {
	case "", BackendPostgres, BackendEtcd:
	default:
		bad("Backend %q: want %q or %q", c.Backend, BackendPostgres, BackendEtcd)
	}
	switch c.PubSub {
	case "", PubSubFake, PubSubEmulator:
	default:
		bad("PubSub %q: want %q or %q", c.PubSub, PubSubFake, PubSubEmulator)
	}
	seen := map[string]bool{}
	for _, e := range c.Executors {
		if e.Name == "" || strings.ContainsAny(e.Name, "/ ") || seen[e.Name] {
			bad("executor name %q: want a unique non-empty name without spaces or slashes", e.Name)
		}
		seen[e.Name] = true
	}
	switch c.EtcdMembers {
	case 0, 1, 3:
	default:
		bad("EtcdMembers %d: want 1 or 3", c.EtcdMembers)
	}
	if c.PushTimeout < 0 {
		bad("PushTimeout %v: want a positive duration (0: payoutbus.DefaultPushTimeout)", c.PushTimeout)
	}
	if c.MaxProcs != 0 && c.MaxProcs != GoDefaultMaxProcs {
		bad("MaxProcs %d: want 0 (ServiceMaxProcs) or GoDefaultMaxProcs (%d)", c.MaxProcs, GoDefaultMaxProcs)
	}
	if c.LeaseTTL < 0 || c.LeaseTTL%time.Millisecond != 0 {
		bad("LeaseTTL %v: want a positive whole number of milliseconds", c.LeaseTTL)
	}
	switch c.LogLevel {
	case "", "debug", "info", "warn", "error":
	default:
		bad("LogLevel %q: want debug, info, warn or error", c.LogLevel)
	}
	return errors.Join(errs...)
}

// Binaries are the commands a Stack runs, as package paths of this module.
var Binaries = map[string]string{
	"lock-server":      "github.com/distributed-lock-lab/distributed-lock-lab/lockserver/cmd/lock-server",
	"etcd-local":       "github.com/distributed-lock-lab/distributed-lock-lab/etcd/cmd/etcd-local",
	"pubsub-fake":      "github.com/distributed-lock-lab/distributed-lock-lab/local/cmd/pubsub-fake",
	"payment-resource": "github.com/distributed-lock-lab/distributed-lock-lab/functions/cmd/payment-resource",
	"rail-proxy":       "github.com/distributed-lock-lab/distributed-lock-lab/functions/cmd/rail-proxy",
	"rail-stub":        "github.com/distributed-lock-lab/distributed-lock-lab/functions/cmd/rail-stub",
	"executor":         "github.com/distributed-lock-lab/distributed-lock-lab/functions/cmd/executor",
	"reconciler":       "github.com/distributed-lock-lab/distributed-lock-lab/functions/cmd/reconciler",
}

// Build compiles every command of Binaries into dir with `go build -o`.
// It must run inside this module (any directory of the repository); Go's
// build cache makes a second build take a second or two.
func Build(ctx context.Context, dir string) error {
	var pkgs []string
	for _, name := range sortedNames() {
		pkgs = append(pkgs, Binaries[name])
	}
	return buildInto(ctx, dir, pkgs...)
}

// buildInto builds the commands pkgs into dir, as Build does.
func buildInto(ctx context.Context, dir string, pkgs ...string) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("%w: the go command is not on PATH: %v", ErrPrerequisite, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("stack: bin dir: %w", err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	args := append([]string{"build", "-o", abs + string(filepath.Separator)}, pkgs...)
	// The go command links in a work folder of its own, in $TMPDIR unless
	// GOTMPDIR says otherwise, and a go build that is killed (Ctrl-C ends
	// ctx) leaves it there with its half-linked binaries. Here it lives
	// inside dir and is removed when the build ends, however it ends; if
	// this process is killed too, dir's owner file lets the next stack
	// remove it (RemoveLeftovers).
	work, err := os.MkdirTemp(abs, ".go-build-")
	if err != nil {
		return fmt.Errorf("stack: go build's work folder: %w", err)
	}
	defer os.RemoveAll(work)
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Env = append(os.Environ(), "GOTMPDIR="+work)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with a killed `local up`
	out, err := cmd.CombinedOutput()
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w during the build (%v): go build was stopped, and its work folder removed", ErrInterrupted, context.Cause(ctx))
	}
	if err != nil {
		return fmt.Errorf("stack: go build (run from inside the repository): %w\n%s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

func sortedNames() []string {
	return []string{"etcd-local", "executor", "lock-server", "payment-resource", "pubsub-fake", "rail-proxy", "rail-stub", "reconciler"}
}

// Stack is a running system. Its methods are safe for concurrent use.
type Stack struct {
	cfg    Config
	dir    string
	bin    string
	ownDir bool // dir is a temporary folder Start made
	log    *slog.Logger

	mu       sync.Mutex
	procs    []*Process // in start order
	clusters []namedCluster
	etcdData string
	stopped  bool // no process may be spawned any more
	stopOnce sync.Once

	lockURL, payURL, proxyURL, stubURL string
	reconcilerURL                      string
	pubsubAddr                         string
	etcdEndpoints                      []string
	payDSN, railDSN, lockDSN           string
	executors                          map[string]*Process
	executorURLs                       map[string]string
	pushURLs                           map[string]string // where the push bridge posts: a link with Config.Links
	pprofAddrs                         map[string]string // by process name, with Config.Pprof
	links                              map[string]*link.Link
	// services holds how each named process was started, for Restart;
	// current its latest process.
	services map[string]service
	current  map[string]*Process
	// exits receives the processes that exit on their own (watch).
	exits chan ProcessExit
	// proofKey is lock-server's grant-proof key, receiptKey
	// rail-proxy's receipt key and termsKey payment-resource's
	// payout-terms key, made fresh by Start.
	proofKey, receiptKey, termsKey fenceproof.SigningKey
}

// SignGrant returns the proof lock-server would send with a grant of
// token on lock key (lockserver/fenceproof), for tests and probes that
// play a holder by hand. Valid after Start.
func (s *Stack) SignGrant(key string, token int64) string {
	return s.proofKey.SignGrant(key, token, time.Now())
}

// namedCluster is a PostgreSQL cluster of the stack and its role.
type namedCluster struct {
	name string
	*pgcluster.Cluster
}

// Start starts every part of the stack described by cfg and returns once
// all are ready. ctx bounds the start (DefaultStartTimeout when it has no
// deadline) and, when it ends later, stops the stack. On failure nothing
// started is left running, and the error names the part that failed: a
// missing prerequisite wraps ErrPrerequisite, a process that exited during
// start wraps ErrExited and includes the last lines of its log.
func Start(ctx context.Context, cfg Config) (*Stack, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Backend == "" {
		cfg.Backend = BackendPostgres
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	cfg.Executors = append([]ExecutorSpec(nil), cfg.Executors...)
	s := &Stack{cfg: cfg, log: cfg.Log, executors: map[string]*Process{}, executorURLs: map[string]string{}, pushURLs: map[string]string{}, pprofAddrs: map[string]string{},
		links: map[string]*link.Link{}, services: map[string]service{}, current: map[string]*Process{}, exits: make(chan ProcessExit, maxExits)}
	if cfg.Dir == "" {
		d, err := os.MkdirTemp("", "dll-stack-")
		if err != nil {
			return nil, fmt.Errorf("stack: run folder: %w", err)
		}
		s.dir, s.ownDir = d, true
	} else {
		d, err := filepath.Abs(cfg.Dir)
		if err == nil {
			err = os.MkdirAll(d, 0o755)
		}
		if err != nil {
			return nil, fmt.Errorf("stack: run folder %s: %w", cfg.Dir, err)
		}
		s.dir = d
	}
	// The big folders of stacks whose process died without Stop (SIGKILL):
	// their children died with them (Pdeathsig), their folders did not.
	removed, err := RemoveLeftovers(os.TempDir(), processAlive)
	for _, d := range removed {
		s.log.Info("removed a dead stack's leftover folder", "dir", d)
	}
	if err != nil {
		s.log.Warn("leftover folders of dead stacks not removed", "error", err.Error())
	}
	// The build is bounded by ctx alone: a first build compiles every
	// dependency, which can take longer than the start's own limit.
	err = CheckPostgres()
	if err == nil {
		err = s.buildBinaries(ctx)
	}
	sctx, cancel := ctx, context.CancelFunc(func() {})
	if _, ok := ctx.Deadline(); !ok {
		sctx, cancel = context.WithTimeout(ctx, DefaultStartTimeout)
	}
	defer cancel()
	if err == nil {
		if err = s.start(sctx); err != nil && ctx.Err() != nil && !errors.Is(err, ErrInterrupted) {
			// Ctrl-C while the clusters and services start: say so,
			// rather than the step that happened to see it ("initdb:
			// context canceled").
			err = fmt.Errorf("%w while the stack was starting (%v); everything it had started is stopped", ErrInterrupted, context.Cause(ctx))
		}
	}
	if err != nil {
		s.Stop()
		if s.ownDir {
			_ = os.Remove(s.dir) // only if nothing was logged in it
		}
		return nil, err
	}
	// Ends when ctx ends or the stack is stopped.
	context.AfterFunc(ctx, s.Stop)
	return s, nil
}

// buildBinaries takes CachedBinaries' folder unless Config.BinDir names
// prebuilt binaries, saying so first: the first build of a fresh clone
// compiles every dependency and takes minutes.
func (s *Stack) buildBinaries(ctx context.Context) error {
	s.bin = s.cfg.BinDir
	if s.bin != "" {
		return nil
	}
	s.log.Info("building the binaries unless built for these sources already (the first build of a clone compiles every dependency and can take several minutes)")
	t0 := time.Now()
	bin, err := CachedBinaries(ctx)
	if err != nil {
		return err
	}
	s.bin = bin
	s.log.Info("binaries ready", "dir", s.bin, "took", time.Since(t0).Round(time.Millisecond))
	return nil
}

// CheckPostgres returns ErrPrerequisite when the PostgreSQL server
// binaries are missing. Start checks it first.
func CheckPostgres() error {
	if _, err := os.Stat(filepath.Join(pgBinDir(), "initdb")); err != nil {
		return fmt.Errorf("%w: PostgreSQL server binaries not found in %s (install postgresql-15 or set %s): %v", ErrPrerequisite, pgBinDir(), pgcluster.EnvBinDir, err)
	}
	return nil
}

func (s *Stack) start(ctx context.Context) error {
	for _, name := range sortedNames() {
		if _, err := os.Stat(filepath.Join(s.bin, name)); err != nil {
			return fmt.Errorf("%w: binary %s missing in %s: build it with `go build -o %s %s` (or leave the binary folder unset and the stack uses CachedBinaries): %v", ErrPrerequisite, name, s.bin, filepath.Join(s.bin, name), Binaries[name], err)
		}
	}

	// The databases and the Pub/Sub fake do not depend on each other:
	// start them side by side.
	var (
		wg   sync.WaitGroup
		errs = make([]error, 3)
	)
	wg.Go(func() { errs[0] = s.startPayDB(ctx) })
	wg.Go(func() { errs[1] = s.startLockBackend(ctx) })
	wg.Go(func() { errs[2] = s.startPubSub(ctx) })
	wg.Wait()
	err := errors.Join(errs...)
	if err != nil {
		return err
	}

	// A fresh key pair for lock-server's grant proofs and one for
	// rail-proxy's receipts: each stack trusts only its own.
	if s.proofKey, err = fenceproof.GenerateSigningKey("local-lock", rand.Reader); err != nil {
		return err
	}
	if s.receiptKey, err = fenceproof.GenerateSigningKey("local-rail", rand.Reader); err != nil {
		return err
	}
	// And one for payment-resource's payout terms, which rail-proxy
	// checks before it forwards anything.
	if s.termsKey, err = fenceproof.GenerateSigningKey("local-pay", rand.Reader); err != nil {
		return err
	}
	lockEnv := []string{config.EnvStore + "=" + s.cfg.Backend, config.EnvProofSigningKey + "=" + s.proofKey.String()}
	if s.cfg.Backend == BackendPostgres {
		dsn, err := s.via(LinkLockDB, s.lockDSN)
		if err != nil {
			return err
		}
		lockEnv = append(lockEnv, config.EnvLockDBURL+"="+dsn)
	} else {
		eps, err := s.viaAll(LinkEtcd, s.etcdEndpoints)
		if err != nil {
			return err
		}
		lockEnv = append(lockEnv, config.EnvEtcdEndpoints+"="+strings.Join(eps, ","))
	}
	if s.lockURL, err = s.startLockServer(ctx, lockEnv); err != nil {
		return err
	}
	wg = sync.WaitGroup{}
	errs = make([]error, 2)
	wg.Go(func() {
		var stubEnv []string
		if s.cfg.RailJournal {
			stubEnv = []string{railstub.EnvJournal + "=" + filepath.Join(s.dir, "rail-stub.journal.jsonl")}
		}
		if s.stubURL, errs[0] = s.startFunction(ctx, "rail-stub", "rail-stub", stubEnv, rail.PathJournal); errs[0] != nil {
			return
		}
		var railDSN, stubURL string
		if railDSN, errs[0] = s.via(LinkRailDB, s.railDSN); errs[0] != nil {
			return
		}
		if stubURL, errs[0] = s.via(LinkRail, s.stubURL); errs[0] != nil {
			return
		}
		s.proxyURL, errs[0] = s.startFunction(ctx, "rail-proxy", "rail-proxy", []string{
			railapi.EnvDatabaseURL + "=" + railDSN, railapi.EnvRailURL + "=" + stubURL,
			railapi.EnvFencingEnabled + "=" + strconv.FormatBool(s.cfg.RailFencing),
			railapi.EnvProofKeys + "=" + s.proofKey.VerifyKey().String(), railapi.EnvReceiptSigningKey + "=" + s.receiptKey.String(),
			railapi.EnvTermsKeys + "=" + s.termsKey.VerifyKey().String(),
		}, "/")
	})
	wg.Go(func() {
		var payDSN string
		if payDSN, errs[1] = s.via(LinkPayDB, s.payDSN); errs[1] != nil {
			return
		}
		s.payURL, errs[1] = s.startFunction(ctx, "payment-resource", "payment-resource", []string{
			payapi.EnvDatabaseURL + "=" + payDSN, payapi.EnvFencingEnabled + "=" + strconv.FormatBool(s.cfg.PaymentFencing),
			payapi.EnvOutboxPollMs + "=50",
			payapi.EnvProofKeys + "=" + s.proofKey.VerifyKey().String(), payapi.EnvReceiptKeys + "=" + s.receiptKey.VerifyKey().String(),
			payapi.EnvTermsSigningKey + "=" + s.termsKey.String(),
			"PUBSUB_EMULATOR_HOST=" + s.pubsubAddr, "PUBSUB_PROJECT=" + PubSubProject,
			"PUBSUB_TOPIC=" + PubSubTopic, "PUBSUB_SETUP_SUBSCRIPTION=" + PubSubSubscription,
		}, "/")
	})
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	wg = sync.WaitGroup{}
	errs = make([]error, len(s.cfg.Executors))
	var mu sync.Mutex
	for i, e := range s.cfg.Executors {
		wg.Go(func() {
			var urls [3]string
			for j, to := range [3]struct{ name, url string }{{ToLockServer, s.lockURL}, {ToPaymentResource, s.payURL}, {ToRailProxy, s.proxyURL}} {
				if urls[j], errs[i] = s.via(ExecutorLink(e.Name, to.name), to.url); errs[i] != nil {
					return
				}
			}
			env := []string{
				lockapi.EnvServerURL + "=" + urls[0], executor.EnvPaymentResourceURL + "=" + urls[1], executor.EnvRailProxyURL + "=" + urls[2],
				executor.EnvOwner + "=" + e.Name, executor.EnvLeaseTTLMs + "=" + strconv.FormatInt(s.cfg.LeaseTTL.Milliseconds(), 10),
			}
			if e.SelfStopBefore != "" {
				env = append(env, fault.EnvSelfStopBeforeSubmit+"="+e.SelfStopBefore)
			}
			url, err := s.startFunction(ctx, "executor-"+e.Name, "executor", env, "/")
			if err != nil {
				errs[i] = err
				return
			}
			push, err := s.via(PushLink(e.Name), url)
			if err != nil {
				errs[i] = err
				return
			}
			mu.Lock()
			s.executorURLs[e.Name] = url
			s.pushURLs[e.Name] = push
			mu.Unlock()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if s.cfg.ReconcileEvery <= 0 {
		return nil
	}
	url, err := s.startFunction(ctx, "reconciler", "reconciler", []string{
		lockapi.EnvServerURL + "=" + s.lockURL, reconciler.EnvPaymentResourceURL + "=" + s.payURL, reconciler.EnvRailProxyURL + "=" + s.proxyURL,
		reconciler.EnvOwner + "=reconciler", reconciler.EnvIntervalMs + "=" + strconv.FormatInt(s.cfg.ReconcileEvery.Milliseconds(), 10),
		reconciler.EnvAuditPaydbURL + "=" + s.payDSN, reconciler.EnvAuditRaildbURL + "=" + s.railDSN, reconciler.EnvAuditRailURL + "=" + s.stubURL,
	}, "/metrics")
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.reconcilerURL = url
	s.mu.Unlock()
	return nil
}

// ReconcilerURL returns the reconciler's base URL (POST
// reconciler.PathRuns runs a pass), or "" when Config.ReconcileEvery is 0.
func (s *Stack) ReconcilerURL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reconcilerURL
}

func pgBinDir() string {
	if d := os.Getenv(pgcluster.EnvBinDir); d != "" {
		return d
	}
	return pgcluster.DefaultBinDir
}

// startCluster starts a throwaway PostgreSQL cluster and creates dbs.
func (s *Stack) startCluster(ctx context.Context, name string, dbs ...string) (*pgcluster.Cluster, error) {
	// syncfs: after a crash, PostgreSQL syncs the data directory before
	// recovery; one syncfs of the file system instead of an fsync of
	// every file cuts a restart after SIGKILL from seconds to a fraction.
	// The server log goes to the run folder, not the cluster's temporary
	// folder: it stays there after Stop and after a SIGKILL of this
	// process, when the cluster's folder is left to RemoveLeftovers (the
	// folder holds pgcluster.OwnerFile from its creation).
	settings := map[string]string{"recovery_init_sync_method": "syncfs"}
	if s.cfg.StatementStats {
		maps.Copy(settings, statementSettings)
	}
	c, err := pgcluster.Start(ctx, pgcluster.Config{Settings: settings, LogPath: s.PostgresLogPath(name)})
	if err != nil {
		return nil, fmt.Errorf("stack: PostgreSQL cluster %s: %w", name, err)
	}
	s.mu.Lock()
	s.clusters = append(s.clusters, namedCluster{name, c})
	s.mu.Unlock()
	if s.cfg.StatementStats {
		if err := enableStatementStats(ctx, namedCluster{name, c}); err != nil {
			return nil, err
		}
	}
	for _, db := range dbs {
		if err := c.CreateDatabase(ctx, db); err != nil {
			return nil, fmt.Errorf("stack: cluster %s: %w", name, err)
		}
	}
	s.log.Info("PostgreSQL cluster ready", "cluster", name, "port", c.Port(), "databases", dbs)
	return c, nil
}

func (s *Stack) startPayDB(ctx context.Context) error {
	c, err := s.startCluster(ctx, "paydb", "paydb", "raildb")
	if err != nil {
		return err
	}
	s.payDSN, s.railDSN = c.DSN("paydb"), c.DSN("raildb")
	return nil
}

func (s *Stack) startLockBackend(ctx context.Context) error {
	if s.cfg.Backend == BackendPostgres {
		c, err := s.startCluster(ctx, "lockdb", "lockdb")
		if err != nil {
			return err
		}
		s.lockDSN = c.DSN("lockdb")
		return nil
	}
	data, err := os.MkdirTemp("", "dll-etcd-")
	if err != nil {
		return fmt.Errorf("stack: etcd data dir: %w", err)
	}
	s.mu.Lock()
	s.etcdData = data
	s.mu.Unlock()
	if err := markOwned(data); err != nil {
		return err
	}
	if s.cfg.EtcdMembers <= 1 {
		eps, err := s.startEtcdProcess(ctx, "etcd", []string{"-members", "1", "-dir", data})
		if err != nil {
			return err
		}
		s.etcdEndpoints = eps
		return nil
	}
	// One process per member: the layout first, then every member at once
	// (a member is ready only once a majority has joined).
	prep := exec.CommandContext(ctx, filepath.Join(s.bin, "etcd-local"), "-members", strconv.Itoa(s.cfg.EtcdMembers), "-dir", data, "-prepare")
	if out, err := prep.CombinedOutput(); err != nil {
		return fmt.Errorf("stack: etcd-local -prepare: %w\n%s", err, out)
	}
	var (
		wg   sync.WaitGroup
		errs = make([]error, s.cfg.EtcdMembers)
		eps  = make([][]string, s.cfg.EtcdMembers)
	)
	for i := range s.cfg.EtcdMembers {
		wg.Go(func() {
			eps[i], errs[i] = s.startEtcdProcess(ctx, "etcd-"+strconv.Itoa(i),
				[]string{"-members", strconv.Itoa(s.cfg.EtcdMembers), "-dir", data, "-member", strconv.Itoa(i)})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	s.etcdEndpoints = eps[0]
	return nil
}

// startEtcdProcess starts etcd-local with args as process name and returns
// the client URLs of every member of its cluster, from its ready line.
func (s *Stack) startEtcdProcess(ctx context.Context, name string, args []string) ([]string, error) {
	svc := service{name: name, bin: "etcd-local", args: args}
	line, err := s.run(ctx, svc)
	if err != nil {
		return nil, err
	}
	var ready struct {
		Endpoints []string `json:"endpoints"`
	}
	if err := json.Unmarshal([]byte(line), &ready); err != nil || len(ready.Endpoints) == 0 {
		return nil, fmt.Errorf("stack: etcd-local ready line %q: %v", line, err)
	}
	s.log.Info("etcd ready", "process", name, "endpoints", ready.Endpoints)
	return ready.Endpoints, nil
}

func (s *Stack) startPubSub(ctx context.Context) error {
	if s.cfg.PubSub == PubSubEmulator {
		return s.startEmulator(ctx)
	}
	line, err := s.run(ctx, service{name: "pubsub-fake", bin: "pubsub-fake"})
	if err != nil {
		return err
	}
	var ready struct {
		Addr string `json:"addr"`
	}
	if err := json.Unmarshal([]byte(line), &ready); err != nil || ready.Addr == "" {
		return fmt.Errorf("stack: pubsub-fake ready line %q: %v", line, err)
	}
	s.pubsubAddr = ready.Addr
	s.log.Info("Pub/Sub fake ready", "addr", ready.Addr)
	return nil
}

// startEmulator starts gcloud's Pub/Sub emulator on a free port and waits
// until it answers HTTP (the Java server takes a few seconds).
func (s *Stack) startEmulator(ctx context.Context) error {
	gcloud, err := exec.LookPath("gcloud")
	if err != nil {
		return fmt.Errorf("%w: -pubsub=emulator needs gcloud with the Pub/Sub emulator component (and Java): %v", ErrPrerequisite, err)
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	p, err := s.spawn("pubsub-emulator", gcloud, []string{"beta", "emulators", "pubsub", "start", "--host-port=" + addr, "--project=" + PubSubProject}, nil, nil)
	if err != nil {
		return err
	}
	// Its own wrapper starts the Java server that listens: not own.
	if err := awaitHTTP(ctx, p, "http://"+addr, func(code int) bool { return code == http.StatusOK }, false); err != nil {
		return err
	}
	s.pubsubAddr = addr
	go s.watch(p) // ends when p exits
	s.log.Info("Pub/Sub emulator ready", "addr", addr, "pid", p.PID())
	return nil
}

func (s *Stack) startLockServer(ctx context.Context, env []string) (string, error) {
	return s.startOnPort(ctx, "lock-server", "lock-server", func(port int) []string {
		return append(env, config.EnvHTTPAddr+"=127.0.0.1:"+strconv.Itoa(port))
	}, "/readyz", func(code int) bool { return code == http.StatusOK })
}

// startFunction starts one of the functions on a free port and waits until
// GET probe answers with anything.
func (s *Stack) startFunction(ctx context.Context, name, bin string, env []string, probe string) (string, error) {
	return s.startOnPort(ctx, name, bin, func(port int) []string {
		return append(append([]string(nil), env...), "HOST=127.0.0.1", "PORT="+strconv.Itoa(port))
	}, probe, func(int) bool { return true })
}

// ServiceMaxProcs is the GOMAXPROCS of lock-server and every function
// process the stack starts, unless the environment sets GOMAXPROCS: one
// P each. A dozen processes share the machine's cores, and each one's work
// per request is a few hundred microseconds; a second P per process buys
// no parallelism there, only threads that wake, spin and sleep again
// around every request (docs/benchmarks.md measured the cost).
const ServiceMaxProcs = 1

// GoDefaultMaxProcs as Config.MaxProcs sets no GOMAXPROCS: Go chooses.
const GoDefaultMaxProcs = -1

// withMaxProcs returns env with GOMAXPROCS=ServiceMaxProcs added, unless
// maxProcs is GoDefaultMaxProcs or lookup (os.LookupEnv) finds GOMAXPROCS
// already set.
func withMaxProcs(env []string, maxProcs int, lookup func(string) (string, bool)) []string {
	if _, set := lookup("GOMAXPROCS"); set || maxProcs == GoDefaultMaxProcs {
		return env
	}
	return append(env, "GOMAXPROCS="+strconv.Itoa(ServiceMaxProcs))
}

func (s *Stack) startOnPort(ctx context.Context, name, bin string, env func(port int) []string, probe string, ok func(int) bool) (string, error) {
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return "", err
		}
		base := "http://127.0.0.1:" + strconv.Itoa(port)
		penv := withMaxProcs(env(port), s.cfg.MaxProcs, os.LookupEnv)
		if s.cfg.LogLevel != "" {
			penv = append(penv, config.EnvLogLevel+"="+s.cfg.LogLevel)
		}
		var paddr string
		if s.cfg.Pprof {
			pport, err := freePort()
			if err != nil {
				return "", err
			}
			paddr = "127.0.0.1:" + strconv.Itoa(pport)
			penv = append(penv, pprofserve.EnvAddr+"="+paddr)
		}
		p, err := s.runProcess(ctx, service{name: name, bin: bin, env: penv, probe: base + probe, ok: ok})
		if err == nil {
			s.log.Info("process ready", "name", name, "url", base, "pid", p.PID(), "log", p.LogPath())
			if paddr != "" {
				s.mu.Lock()
				s.pprofAddrs[name] = paddr
				s.mu.Unlock()
			}
			return base, nil
		}
		if errors.Is(err, ErrExited) && p != nil && isBindError(p) && attempt < portAttempts {
			s.log.Info("port taken; retrying on another", "name", name, "port", port)
			continue
		}
		return "", err
	}
}

// service is how a named process of the stack is started, and restarted
// (same binary, arguments and environment, so the same port and data).
type service struct {
	name, bin string
	args, env []string
	// probe is the URL polled until ok accepts its status; "" waits for
	// the first line on stdout instead.
	probe string
	ok    func(status int) bool
}

// run starts svc and waits until it is ready; it returns the first
// stdout line of a service without a probe.
func (s *Stack) run(ctx context.Context, svc service) (string, error) {
	var line string
	_, err := s.runProcessLine(ctx, svc, &line)
	return line, err
}

func (s *Stack) runProcess(ctx context.Context, svc service) (*Process, error) {
	return s.runProcessLine(ctx, svc, nil)
}

// runProcessLine spawns svc, waits until it is ready and records it as
// the current process of its name. A process that fails to become ready
// is returned with the error (nil when it never started).
func (s *Stack) runProcessLine(ctx context.Context, svc service, line *string) (*Process, error) {
	var lines chan string
	if svc.probe == "" {
		lines = make(chan string, 1)
	}
	p, err := s.spawn(svc.name, svc.bin, svc.args, svc.env, lines)
	if err != nil {
		return nil, err
	}
	if svc.probe == "" {
		l, err := awaitLine(ctx, p, lines)
		if err != nil {
			return p, err
		}
		if line != nil {
			*line = l
		}
	} else if err := awaitHTTP(ctx, p, svc.probe, svc.ok, true); err != nil {
		return p, err
	}
	s.mu.Lock()
	s.services[svc.name] = svc
	s.current[svc.name] = p
	if strings.HasPrefix(svc.name, "executor-") {
		s.executors[strings.TrimPrefix(svc.name, "executor-")] = p
	}
	s.mu.Unlock()
	go s.watch(p) // ends when p exits
	return p, nil
}

// Clusters named by Kill and Restart, besides the processes of Names.
const (
	// ClusterPaydb is the PostgreSQL cluster of paydb and raildb.
	ClusterPaydb = "postgres-paydb"
	// ClusterLockdb is the PostgreSQL cluster of lockdb (postgres backend).
	ClusterLockdb = "postgres-lockdb"
)

// Names returns the names Kill and Restart accept: every process started
// (lock-server, executor-A, rail-stub, etcd or etcd-0..2, ...) and the
// PostgreSQL clusters (ClusterPaydb, ClusterLockdb), sorted.
func (s *Stack) Names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for n := range s.services {
		out = append(out, n)
	}
	for _, c := range s.clusters {
		out = append(out, "postgres-"+c.name)
	}
	slices.Sort(out)
	return out
}

// ErrNoSuchPart: Kill or Restart of a name that is not one of Names.
var ErrNoSuchPart = errors.New("stack: no such process or cluster")

func (s *Stack) cluster(name string) *pgcluster.Cluster {
	for _, c := range s.clusters {
		if "postgres-"+c.name == name {
			return c.Cluster
		}
	}
	return nil
}

// Kill sends SIGKILL to the process called name (its whole process
// group) and waits until it has exited, or kills a PostgreSQL cluster's
// server and its backends (pgcluster.Cluster.Kill). Nothing restarts it
// until Restart. ErrNoSuchPart for an unknown name.
func (s *Stack) Kill(name string) error {
	s.mu.Lock()
	c, p := s.cluster(name), s.current[name]
	s.mu.Unlock()
	switch {
	case c != nil:
		return c.Kill()
	case p == nil:
		return fmt.Errorf("%w: %q", ErrNoSuchPart, name)
	}
	p.mu.Lock()
	p.stopped = true // Stop must not signal its (possibly reused) pid again
	p.mu.Unlock()
	select {
	case <-p.done: // exited on its own: its pid may belong to another process now
	default:
		_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
		<-p.done
	}
	return nil
}

// Restart starts the process called name again, as its supervisor would:
// same binary, arguments and environment (so the same port, data
// directory and journal), and waits until it is ready by the same check as
// at Start; for a cluster, it starts the server on its data directory and
// port (crash recovery after Kill). The process must have exited (Kill).
// ctx bounds the wait. ErrNoSuchPart for an unknown name.
func (s *Stack) Restart(ctx context.Context, name string) error {
	s.mu.Lock()
	c, svc, ok := s.cluster(name), s.services[name], s.services[name].name != ""
	s.mu.Unlock()
	switch {
	case c != nil:
		return c.Start(ctx)
	case !ok:
		return fmt.Errorf("%w: %q", ErrNoSuchPart, name)
	}
	p, err := s.runProcess(ctx, svc)
	if err == nil {
		s.log.Info("process restarted", "name", name, "pid", p.PID())
	}
	return err
}

// ClusterPID returns the postmaster's process id of the PostgreSQL
// cluster called name (ClusterPaydb, ClusterLockdb), 0 while it is
// stopped, or ErrNoSuchPart for a name that is not one of the stack's
// clusters. Its backends are its children: `kill -STOP <pid> $(pgrep -P
// <pid>)` freezes the cluster by hand as Freeze does.
func (s *Stack) ClusterPID(name string) (int, error) {
	s.mu.Lock()
	c := s.cluster(name)
	s.mu.Unlock()
	if c == nil {
		return 0, fmt.Errorf("%w: %q", ErrNoSuchPart, name)
	}
	return c.PID(), nil
}

// Freeze makes the part called name stop answering without going away:
// a PostgreSQL cluster (ClusterPaydb: paydb and raildb; ClusterLockdb)
// is frozen with pgcluster.Cluster.Freeze (SIGSTOP of the server and its
// backends: connections are accepted by the kernel and never answered,
// as a hung host or a paused VM looks to its clients); a process
// (pubsub-fake, etcd-1, ...) gets SIGSTOP on its whole process group.
// Thaw resumes it; Stop thaws first (a stopped process gets SIGCONT with
// its SIGTERM). ErrNoSuchPart for an unknown name.
func (s *Stack) Freeze(name string) error { return s.freeze(name, syscall.SIGSTOP) }

// Thaw resumes the part Freeze stopped (SIGCONT, pgcluster.Cluster.Thaw).
// It is a no-op for a part that is not frozen. ErrNoSuchPart for an
// unknown name.
func (s *Stack) Thaw(name string) error { return s.freeze(name, syscall.SIGCONT) }

func (s *Stack) freeze(name string, sig syscall.Signal) error {
	s.mu.Lock()
	c, p := s.cluster(name), s.current[name]
	s.mu.Unlock()
	switch {
	case c != nil && sig == syscall.SIGSTOP:
		return c.Freeze()
	case c != nil:
		return c.Thaw()
	case p == nil:
		return fmt.Errorf("%w: %q", ErrNoSuchPart, name)
	}
	select {
	case <-p.done:
		return fmt.Errorf("stack: %s has exited", name)
	default:
	}
	return syscall.Kill(-p.PID(), sig)
}

// spawn starts a binary of the stack with its log in the run folder and
// records it for Stop.
func (s *Stack) spawn(name, bin string, args, env []string, firstLine chan<- string) (*Process, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil, errors.New("stack: stopped")
	}
	if !filepath.IsAbs(bin) {
		bin = filepath.Join(s.bin, bin)
	}
	p, err := spawn(name, bin, filepath.Join(s.dir, name+".log"), args, env, firstLine)
	if err != nil {
		return nil, err
	}
	s.procs = append(s.procs, p)
	return p, nil
}

// PostgresLogPath is the server log of the stack's PostgreSQL cluster
// name ("paydb", "lockdb"), in the run folder: written there from the start,
// so that it is kept after Stop and after a crash of the stack's process.
func (s *Stack) PostgresLogPath(name string) string {
	return filepath.Join(s.dir, "postgres-"+name+".log")
}

// Stop stops every process (in reverse start order, SIGTERM then SIGKILL
// after a grace period; a stopped process is continued so it can exit),
// stops and removes the PostgreSQL clusters (their server logs are in the
// run folder: PostgresLogPath) and removes etcd's data. The run folder
// with the logs stays. Stop is idempotent and safe to call concurrently.
func (s *Stack) Stop() { s.stopOnce.Do(s.stop) }

func (s *Stack) stop() {
	s.mu.Lock()
	s.stopped = true
	procs, clusters, etcdData := s.procs, s.clusters, s.etcdData
	s.mu.Unlock()
	// Clients first, so that none sees its dependency vanish and logs
	// alarms; then the services; then the infrastructure.
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].stop(stopGrace)
	}
	s.closeLinks()
	// The clusters at once: each stop is mostly its shutdown checkpoint's
	// flush, which the two need not wait for in turn.
	var wg sync.WaitGroup
	for _, c := range clusters {
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(context.Background(), stopGrace)
			_ = c.Stop(sctx) // Close kills the server if this did not stop it
			cancel()
			// The server log is in the run folder already (PostgresLogPath).
			if err := c.Close(); err != nil {
				s.log.Warn("PostgreSQL cluster close", "cluster", c.name, "error", err.Error())
			}
		})
	}
	wg.Wait()
	if etcdData != "" {
		_ = os.RemoveAll(etcdData)
	}
	s.log.Info("stack stopped", "dir", s.dir)
}

// Dir returns the run folder, which holds one log file per process.
func (s *Stack) Dir() string { return s.dir }

// Backend returns lock-server's backend, "postgres" or "etcd".
func (s *Stack) Backend() string { return s.cfg.Backend }

// LeaseTTL returns the executors' lease TTL.
func (s *Stack) LeaseTTL() time.Duration { return s.cfg.LeaseTTL }

// LockServerURL returns lock-server's base URL.
func (s *Stack) LockServerURL() string { return s.lockURL }

// PaymentResourceURL returns payment-resource's base URL.
func (s *Stack) PaymentResourceURL() string { return s.payURL }

// RailProxyURL returns rail-proxy's base URL.
func (s *Stack) RailProxyURL() string { return s.proxyURL }

// RailStubURL returns the rail-stub's base URL.
func (s *Stack) RailStubURL() string { return s.stubURL }

// PubSubAddr returns the Pub/Sub fake's host:port, the value for
// PUBSUB_EMULATOR_HOST.
func (s *Stack) PubSubAddr() string { return s.pubsubAddr }

// EtcdEndpoints returns etcd's client URLs, one per member (nil with the
// postgres backend); each also serves the member's Prometheus metrics at
// /metrics.
func (s *Stack) EtcdEndpoints() []string { return s.etcdEndpoints }

// PayDBURL returns the DSN of paydb.
func (s *Stack) PayDBURL() string { return s.payDSN }

// RailDBURL returns the DSN of raildb.
func (s *Stack) RailDBURL() string { return s.railDSN }

// LockDBURL returns the DSN of lockdb ("" with the etcd backend).
func (s *Stack) LockDBURL() string { return s.lockDSN }

// PprofAddrs returns, by process name (lock-server, payment-resource,
// executor-A, ...), the host:port where each serves Go's profiler
// (/debug/pprof/), with Config.Pprof; empty without it. A restarted
// process keeps its address.
func (s *Stack) PprofAddrs() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]string, len(s.pprofAddrs))
	for k, v := range s.pprofAddrs {
		out[k] = v
	}
	return out
}

// Executor returns the process of the executor called name, or nil.
func (s *Stack) Executor(name string) *Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.executors[name]
}

// ExecutorURL returns the push endpoint of the executor called name, or "".
func (s *Stack) ExecutorURL(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.executorURLs[name]
}

// Exited returns the channel that receives each process of the stack that
// exits on its own once it was ready: neither killed by Kill nor stopped
// by Stop. Processes restarted by Restart are covered from their
// readiness on; a process that exits before it is ready is Start's or
// Restart's error instead. The channel keeps the first maxExits exits
// until they are read (one reader), and is never closed. A stack that
// loses a part is broken: `local up` and the crash soak report it.
func (s *Stack) Exited() <-chan ProcessExit { return s.exits }

// maxExits is how many exits Exited's channel holds unread; later ones
// are dropped.
const maxExits = 16

// watch sends p to s.exits when it exits on its own. It returns when p
// has exited.
func (s *Stack) watch(p *Process) {
	<-p.Done()
	p.mu.Lock()
	killed := p.stopped
	p.mu.Unlock()
	s.mu.Lock()
	stopped := s.stopped
	s.mu.Unlock()
	if killed || stopped {
		return
	}
	select {
	case s.exits <- ProcessExit{Name: p.Name(), PID: p.PID(), Err: p.err, LogPath: p.LogPath(), LogTail: p.logTail()}:
	default:
	}
}

// ProcessExit describes a process that exited on its own.
type ProcessExit struct {
	// Name is the process name (lock-server, executor-A, ...); PID its
	// operating-system process id.
	Name string
	PID  int
	// Err is how it exited (nil for status 0).
	Err error
	// LogPath is its log file; LogTail its last lines.
	LogPath, LogTail string
}

// Processes returns every process started, in start order.
func (s *Stack) Processes() []*Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Process(nil), s.procs...)
}

// Signal sends sig to the executor called name.
func (s *Stack) Signal(name string, sig syscall.Signal) error {
	p := s.Executor(name)
	if p == nil {
		return fmt.Errorf("stack: no executor %q", name)
	}
	return p.Signal(sig)
}
