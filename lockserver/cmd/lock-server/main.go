// Command lock-server serves the lock API (package lockserver/api) over the
// backend chosen by LOCK_STORE: "postgres" (package pgstore) or "etcd"
// (package etcdstore). Configuration is read from the environment (every
// key in docs/configuration.md); logs are JSON on stderr. On SIGINT or
// SIGTERM it stops accepting connections, drains the requests in flight
// (LOCK_SHUTDOWN_TIMEOUT_MS), waits for the background releases of
// abandoned grants (lockserver.Server.Close), then closes the backend. It
// holds no lease state of its own, so a restart loses nothing.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/envcheck"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpserve"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/logjson"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pprofserve"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/etcdstore"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/pgstore"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// After the first signal, the default behaviour returns: a second one
	// stops the process at once instead of waiting for the drain.
	context.AfterFunc(ctx, stop)
	if err := run(ctx, os.Getenv, os.Environ(), os.Stderr, nil); err != nil {
		// One line, however many settings were wrong (errors.Join puts
		// each on a line of its own).
		fmt.Fprintln(os.Stderr, "lock-server:", strings.ReplaceAll(err.Error(), "\n", "; "))
		os.Exit(1)
	}
}

// run starts the server and blocks until ctx ends; environ (os.Environ's
// form) is checked for variables with the project's prefixes that
// lock-server does not read. Logs go to stderr. When ready is not nil it
// receives the bound address once the server accepts connections.
func run(ctx context.Context, getenv func(string) string, environ []string, stderr io.Writer, ready chan<- net.Addr) error {
	cfg, err := loadConfig(getenv)
	log := logjson.NewInProject(stderr, cfg.LogLevel, logjson.OnGoogleCloud(os.Getenv), logjson.Project(os.Getenv)).With("service", "lock-server")
	// Before refusing a bad configuration too: a misspelt LOCKDB_URL is
	// both "LOCKDB_URL is required" and an unknown variable.
	envcheck.Warn(log, append(envNames(), pprofserve.EnvAddr), environ) // PPROF_ADDR: read by pprofserve.LoadConfig below
	if err != nil {
		return err
	}

	pcfg, err := pprofserve.LoadConfig(getenv)
	if err != nil {
		return err
	}
	tcfg, err := tracing.LoadConfig(getenv)
	if err != nil {
		return err
	}
	stopTracing, err := tracing.Setup(ctx, "lock-server", tcfg, log)
	if err != nil {
		return err
	}
	defer flushTraces(stopTracing, log)

	store, err := openStore(ctx, cfg, log)
	if err != nil {
		return err
	}
	// run owns the store and closes it, once, last: after the HTTP
	// server's drain and the Server's Close below, whose background
	// releases use it. The Server never closes it.
	defer store.Close()

	scfg := lockserver.DefaultServerConfig()
	scfg.RequestTimeout = cfg.RequestTimeout
	scfg.ProofKey = cfg.ProofKey
	scfg.MaxInFlight = cfg.MaxInFlight
	scfg.StallProbeTimeout = cfg.StallProbeTimeout
	scfg.Batching, scfg.Batch = cfg.Batching, cfg.Batch
	scfg.Handoff = cfg.Handoff
	scfg.Registry, err = newRegistry(store)
	if err != nil {
		return err
	}
	h, err := lockserver.NewServer(store, scfg, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Addr, err)
	}
	// The profiler, only when PPROF_ADDR asks for it, on a listener of its
	// own; it ends with ctx.
	_, waitPprof, err := pprofserve.Start(ctx, pcfg, ln.Addr(), log)
	if err != nil {
		_ = ln.Close()
		return err
	}
	defer waitPprof()
	hcfg := httpserve.DefaultConfig()
	hcfg.ReadHeaderTimeout = 5 * time.Second
	hcfg.ReadTimeout = 5 * time.Second // bodies are at most 4 KiB
	hcfg.WriteTimeout = writeTimeout(cfg.RequestTimeout)
	hcfg.ShutdownTimeout = cfg.ShutdownTimeout
	served := make(chan error, 1)
	// Ends when ctx ends and the drain is over (or the server fails).
	go func() {
		served <- httpserve.Serve(ctx, ln, tracing.Handler("lock-server", h, api.PathHealth, api.PathReady, lockserver.PathMetrics), hcfg, log)
	}()
	started := []any{"event", lockserver.EventServerStarted, "addr", ln.Addr().String(), "store", cfg.Store}
	if !cfg.ProofKey.IsZero() {
		started = append(started, "proofKeyId", cfg.ProofKey.ID())
	}
	started = append(started, "batching", cfg.Batching, "handoff", cfg.Handoff)
	if cfg.Batching {
		started = append(started, "batchMax", cfg.Batch.MaxSize, "batchWindowUs", cfg.Batch.Window.Microseconds())
	}
	if cfg.Store == "etcd" {
		started = append(started, "etcdPrefix", cfg.Etcd.Prefix, "etcdIdleLeases", cfg.Etcd.IdleLeases)
	}
	log.Info("lock-server started", started...)
	if ready != nil {
		ready <- ln.Addr()
	}

	var serveErr error
	select {
	case serveErr = <-served:
		// The server failed before ctx ended.
	case <-ctx.Done():
		log.Info("lock-server stopping", "event", lockserver.EventServerStopping)
		serveErr = <-served
	}
	// The handlers are done (or were cut by the drain's timeout): wait
	// for the releases of abandoned grants they started, which need the
	// store, closed after this by the deferred call above.
	if err := h.Close(); err != nil {
		log.Warn("releases of abandoned grants still running at stop; their leases end by their TTL if they fail",
			"event", lockserver.EventAbandonedReleasesUnfinished, "error", err.Error())
	}
	switch {
	case errors.Is(serveErr, httpserve.ErrDrainTimeout):
		// A client that never finishes its request held the drain open;
		// past the timeout its connection was cut rather than hang.
		log.Warn("drain timed out; closed the remaining connections", "event", lockserver.EventServerDrainTimeout, "error", serveErr.Error())
	case serveErr != nil:
		return serveErr
	}
	log.Info("lock-server stopped", "event", lockserver.EventServerStopped)
	return nil
}

// flushTraces sends the spans still buffered, for at most 2 s.
func flushTraces(stop func(context.Context) error, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := stop(ctx); err != nil {
		log.Warn("traces not flushed", "event", tracing.EventFlushFailed, "error", err.Error())
	}
}

func openStore(ctx context.Context, cfg config, log *slog.Logger) (store.LockStore, error) {
	switch cfg.Store {
	case "postgres":
		s, err := pgstore.Open(ctx, cfg.LockDB, log)
		if err != nil {
			return nil, fmt.Errorf("open lockdb: %w", err)
		}
		return s, nil
	case "etcd":
		s, err := etcdstore.Open(ctx, cfg.Etcd, log)
		if err != nil {
			return nil, fmt.Errorf("open etcd: %w", err)
		}
		return s, nil
	}
	return nil, fmt.Errorf("unknown store %q", cfg.Store)
}

// newRegistry returns the registry served at /metrics: the Go runtime and
// process collectors, the server's request metrics (added by NewServer)
// and, on etcd, the lease counts of etcdstore. No label carries a lock
// key, owner or token.
func newRegistry(store store.LockStore) (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	cs := []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	}
	if es, ok := store.(*etcdstore.Store); ok {
		cs = append(cs,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "lockserver_etcd_idle_leases",
				Help: "Idle etcd leases: granted ahead of time, never used, each for one later grant.",
			}, func() float64 { return float64(es.LeaseStats().Idle) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "lockserver_etcd_leases_granted_total",
				Help: "etcd leases granted (one raft write each), ahead of time or by an acquire.",
			}, func() float64 { return float64(es.LeaseStats().Granted) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "lockserver_etcd_grants_from_pool_total",
				Help: "Grants made on an idle etcd lease granted ahead of time, without waiting for a lease grant.",
			}, func() float64 { return float64(es.LeaseStats().FromPool) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "lockserver_etcd_leases_revoked_total",
				Help: "etcd leases revoked after their grant ended, off the request's path (a raft write and a backend commit each).",
			}, func() float64 { return float64(es.LeaseStats().Revoked) }),
		)
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	return reg, nil
}

// writeTimeout is the server's bound on writing one answer, counted from
// the end of the request's headers: the longest a request may work (a
// backend call of requestTimeout after the longest wait an acquire may
// ask for, api.MaxWaitMs) plus 5 s for the answer itself. Shorter, a
// waiting acquire granted late would lose its answer (the connection is
// closed unanswered) and leave a lease nobody knows it holds.
func writeTimeout(requestTimeout time.Duration) time.Duration {
	return time.Duration(api.MaxWaitMs)*time.Millisecond + requestTimeout + 5*time.Second
}
