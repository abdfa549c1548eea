package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	payapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutbus"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/reconciler"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
	lockapi "github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/config"
)

// pushBridgeLog is the push bridges' JSON log in the run folder.
const pushBridgeLog = "push-bridge.log"

// up starts the whole stack as separate processes, prints where each part
// listens, and waits for ctx to end (Ctrl-C, SIGTERM) or for its parent
// process to exit (stack.WithParent: `go run` killed by SIGTERM does not
// pass the signal on); everything is stopped before it returns.
func up(ctx context.Context, args []string, out io.Writer) error {
	// From the very start: a parent that dies while the stack is still
	// starting stops the start too.
	ctx, stopWatch := stack.WithParent(ctx, stack.ParentPollInterval)
	defer stopWatch()
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	backend := fs.String("backend", stack.BackendPostgres, "lock-server's LOCK_STORE: postgres or etcd")
	payFence := fs.Bool("payment-fencing", true, "payment.fencing.enabled (off only to demonstrate corruption)")
	railFence := fs.Bool("rail-fencing", true, "rail.proxy.fencing.enabled (off only to demonstrate corruption)")
	executors := fs.String("executors", "A,B", "comma-separated executor names, one process each")
	dir := fs.String("dir", "", "run folder for the logs (default: a new temporary directory)")
	ttl := fs.Duration("lease-ttl", stack.DefaultLeaseTTL, "the executors' lease TTL")
	push := fs.Bool("push", true, "deliver payout events to the executors, as a Pub/Sub push subscription would")
	reconcileEvery := fs.Duration("reconcile-every", 10*time.Second, "run a reconciler pass this often (0: no reconciler process)")
	pushTimeout := fs.Duration("push-timeout", payoutbus.DefaultPushTimeout, "how long the push bridge waits for an executor's answer before the message is redelivered (the cloud subscription's ack deadline)")
	pubsub := fs.String("pubsub", stack.PubSubFake, "Pub/Sub server: fake (pstest in its own process) or emulator (gcloud's Pub/Sub emulator)")
	pprof := fs.Bool("pprof", false, "serve Go's profiler from lock-server and every function, each on a loopback port of its own (PPROF_ADDR)")
	traces := fs.String("traces", "", "write every process's trace spans to this file, one span per line as JSON (default: no tracing, unless OTEL_EXPORTER_OTLP_ENDPOINT is set)")
	links := fs.Bool("links", false, "put a TCP proxy (package local/link, toxiproxy) on every path between two processes, listed at start; the harness injects network faults into them")
	if err := fs.Parse(args); err != nil {
		return err
	}
	tracing := "off (-traces FILE writes every span to FILE; docs/tracing.md)"
	if e := os.Getenv(otelEndpoint); e != "" {
		tracing = "on: every process exports OTLP/HTTP to " + e + " (" + otelEndpoint + ")"
	}
	if *traces != "" {
		path, err := filepath.Abs(*traces)
		if err != nil {
			return err
		}
		sink, endpoint, err := startTraceSink(path)
		if err != nil {
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = sink.Close(sctx)
		}()
		// Every process of the stack inherits this environment.
		if err := os.Setenv(otelEndpoint, endpoint); err != nil {
			return err
		}
		tracing = "on: every process's spans are appended to " + path + " (one span per line as JSON; grep a log line's traceId)"
	}
	if *pubsub == "" {
		*pubsub = stack.PubSubFake
	}
	cfg := stack.Config{
		Backend: *backend, PaymentFencing: *payFence, RailFencing: *railFence,
		Dir: *dir, LeaseTTL: *ttl, PubSub: *pubsub, ReconcileEvery: *reconcileEvery, PushTimeout: *pushTimeout, Pprof: *pprof, Links: *links,
		Log: slog.New(slog.NewTextHandler(os.Stderr, nil)),
	}
	for _, n := range strings.Split(*executors, ",") {
		if n = strings.TrimSpace(n); n != "" {
			cfg.Executors = append(cfg.Executors, stack.ExecutorSpec{Name: n})
		}
	}
	t0 := time.Now()
	// The binaries are built once per state of the sources and kept in the
	// user's cache folder, so a second start links nothing.
	fmt.Fprintln(out, "building the binaries, or finding them built for these sources (a fresh clone's first build compiles every dependency: minutes)")
	bin, err := stack.CachedBinaries(ctx)
	if err != nil {
		return err
	}
	cfg.BinDir = bin
	st, err := stack.Start(ctx, cfg)
	if err != nil {
		return err
	}
	defer st.Stop()
	fmt.Fprintf(out, "stack ready in %v (backend %s, payment fencing %v, rail fencing %v)\n",
		time.Since(t0).Round(time.Millisecond), st.Backend(), *payFence, *railFence)
	fmt.Fprintf(out, "  lock-server       %s\n", st.LockServerURL())
	fmt.Fprintf(out, "  payment-resource  %s\n", st.PaymentResourceURL())
	fmt.Fprintf(out, "  rail-proxy        %s\n", st.RailProxyURL())
	fmt.Fprintf(out, "  rail-stub         %s\n", st.RailStubURL())
	for _, e := range cfg.Executors {
		fmt.Fprintf(out, "  executor %-8s %s (pid %d)\n", e.Name, st.ExecutorURL(e.Name), st.Executor(e.Name).PID())
	}
	if u := st.ReconcilerURL(); u != "" {
		fmt.Fprintf(out, "  reconciler        %s (a pass every %v; POST %s runs one now)\n", u, *reconcileEvery, reconciler.PathRuns)
	}
	fmt.Fprintf(out, "  %-17s PUBSUB_EMULATOR_HOST=%s (project %s, topic %s, subscription %s)\n",
		"Pub/Sub ("+cfg.PubSub+")", st.PubSubAddr(), stack.PubSubProject, stack.PubSubTopic, stack.PubSubSubscription)
	if eps := st.EtcdEndpoints(); len(eps) > 0 {
		fmt.Fprintf(out, "  etcd              %s\n", strings.Join(eps, ","))
	}
	if u := st.LockDBURL(); u != "" {
		fmt.Fprintf(out, "  lockdb            %s%s\n", u, postmaster(st, stack.ClusterLockdb))
	}
	fmt.Fprintf(out, "  paydb             %s%s\n  raildb            %s (the same cluster)\n", st.PayDBURL(), postmaster(st, stack.ClusterPaydb), st.RailDBURL())
	fmt.Fprintf(out, "  logs              %s (one per process, and the PostgreSQL server logs postgres-*.log; kept after the stack stops or is killed)\n", st.Dir())
	fmt.Fprintf(out, "  tracing           %s\n", tracing)
	for _, name := range st.LinkNames() {
		if l, err := st.Link(name); err == nil {
			fmt.Fprintf(out, "  link %-33s %s\n", name, strings.Join(l.Addrs(), ","))
		}
	}
	pp := st.PprofAddrs()
	for _, name := range slices.Sorted(maps.Keys(pp)) {
		fmt.Fprintf(out, "  pprof %-11s http://%s/debug/pprof/\n", name, pp[name])
	}
	if *push && len(cfg.Executors) > 0 {
		// The bridges run in this process: their lines go to this
		// process's standard error as text and, as JSON, to a log in the
		// run folder, which outlives the terminal (push_dead_lettered is
		// the evidence of payouts left pending).
		path := filepath.Join(st.Dir(), pushBridgeLog)
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("push bridge log: %w", err)
		}
		defer f.Close()
		log := slog.New(slog.NewMultiHandler(cfg.Log.Handler(), slog.NewJSONHandler(f, nil)))
		stopPush, err := st.Push(ctx, log)
		if err != nil {
			return err
		}
		defer stopPush()
		fmt.Fprintf(out, "  push bridge       subscription %s -> one puller per executor; Pub/Sub spreads payouts over them (often all to one); log %s\n", stack.PubSubSubscription, path)
	}
	fmt.Fprintf(out, "To paste into another shell (the names README.md and docs/runbooks use):\n%s", exports(st, cfg))
	fmt.Fprintf(out, "Ctrl-C stops everything (the log folder stays); from another shell: kill %d (SIGINT or SIGTERM),\n", os.Getpid())
	fmt.Fprintf(out, "or kill its parent (pid %d; `go run` passes no signal on): the stack notices and stops\n", os.Getppid())
	exited := st.Exited()
	for {
		select {
		case <-ctx.Done():
			if errors.Is(context.Cause(ctx), stack.ErrParentGone) {
				fmt.Fprintln(out, "parent process gone; stopping the stack")
			}
			return nil
		case e := <-exited:
			// The stack keeps running without it; say so loudly.
			fmt.Fprintf(out, "WARNING: %s exited on its own (%v); its log: %s\n", e.Name, e.Err, e.LogPath)
		}
	}
}

// postmaster names the postmaster of the cluster called name for the
// banner, and how to freeze the cluster by hand (SIGSTOP of the server and
// its backends, as stack.Stack.Freeze does); "" when it is not running.
func postmaster(st *stack.Stack, name string) string {
	pid, err := st.ClusterPID(name)
	if err != nil || pid == 0 {
		return ""
	}
	return fmt.Sprintf(" (postmaster pid %d; freeze: kill -STOP %d $(pgrep -P %d), thaw: -CONT)", pid, pid, pid)
}

// otelEndpoint is the standard variable every process of the stack reads
// for where to send its spans (internal/tracing).
const otelEndpoint = "OTEL_EXPORTER_OTLP_ENDPOINT"

// exports returns the banner's export lines: each part's URL under the
// name the README and the runbooks use, single-quoted for the shell.
func exports(st *stack.Stack, cfg stack.Config) string {
	var b strings.Builder
	line := func(comment string, kv ...string) {
		b.WriteString("  export")
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] != "" {
				fmt.Fprintf(&b, " %s='%s'", kv[i], kv[i+1])
			}
		}
		fmt.Fprintf(&b, "   # %s\n", comment)
	}
	line("lock-server (lockctl reads "+lockapi.EnvServerURL+")", "LS", st.LockServerURL(), lockapi.EnvServerURL, st.LockServerURL())
	line("payment-resource, rail-proxy, rail-stub", "PAY", st.PaymentResourceURL(), "PROXY", st.RailProxyURL(), "STUB", st.RailStubURL())
	if u := st.ReconcilerURL(); u != "" {
		line("the reconciler", "RECONCILER", u)
	}
	line("the databases (psql \"$"+payapi.EnvDatabaseURL+"\")", payapi.EnvDatabaseURL, st.PayDBURL(), railapi.EnvDatabaseURL, st.RailDBURL(), config.EnvLockDBURL, st.LockDBURL())
	if eps := st.EtcdEndpoints(); len(eps) > 0 {
		line("etcd's members", "ETCD", strings.Join(eps, ","))
	}
	if len(cfg.Executors) > 0 {
		first := cfg.Executors[0].Name
		line("the run folder, the push bridges' log, executor "+first+"'s log", "RUN_DIR", st.Dir(),
			"PUSH_LOG", filepath.Join(st.Dir(), pushBridgeLog), "EXECUTOR_LOG", st.Executor(first).LogPath())
	} else {
		line("the run folder", "RUN_DIR", st.Dir())
	}
	return b.String()
}
