// Package serve runs one of the payout functions as a process: it builds
// the function's handler from the environment and serves it at "/" (as
// Cloud Run functions serve it), with its metrics at PathMetrics, on
// $PORT (default 8080) and $HOST (default: every interface), on the
// project's hardened server (internal/httpserve: timeouts, a drain on
// SIGTERM, the path check before any mux). The images and the local stack
// run it, which is what lets the fencing experiment SIGSTOP a real worker.
// Build is the same function without the server: the module's root
// package uses it to serve the functions through functions-framework-go
// (docs/cloud.md says why the images do not).
package serve

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/envcheck"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpmetrics"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpserve"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/logjson"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pprofserve"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
)

// Builder makes a function's handler from the environment. close is called
// once when the process is told to stop; it must release what the handler
// holds (pools, publishers, background goroutines) and may be nil.
type Builder func(ctx context.Context, getenv func(string) string, log *slog.Logger) (h http.Handler, close func(), err error)

// Main runs the function called name:
// JSON logs on stderr (level from LOG_LEVEL), the handler from build served
// on $HOST:$PORT (default every interface, port 8080) by internal/httpserve,
// its metrics (extra included) at PathMetrics, Go's profiler on a loopback
// address when PPROF_ADDR is set, and traces from the standard OTEL_*
// variables. known lists the environment variables build reads; any other
// with one of envcheck.Prefixes gets a WARN line at start. On SIGINT or
// SIGTERM it drains the requests in flight, calls close and returns; a
// second signal stops the process at once. It exits with status 1 if the
// function cannot start or the drain had to cut requests.
func Main(name string, known []string, build Builder, extra ...prometheus.Collector) {
	log, err := Logger(name, os.Getenv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, stop)
	if err := run(ctx, name, known, os.Environ(), os.Getenv, build, log, extra, nil); err != nil {
		log.Error("function failed", "event", EventFunctionFailed, "error", err.Error())
		os.Exit(1)
	}
}

// Logger returns the logger of the function called name: JSON on stderr,
// level from LOG_LEVEL (default info), with Cloud Logging's keys on Google
// Cloud (see logjson), every line carrying "service".
func Logger(name string, getenv func(string) string) (*slog.Logger, error) {
	level := slog.LevelInfo
	if v := getenv("LOG_LEVEL"); v != "" {
		if err := level.UnmarshalText([]byte(v)); err != nil {
			return nil, fmt.Errorf("LOG_LEVEL=%q: want debug, info, warn or error", v)
		}
	}
	return logjson.NewInProject(os.Stderr, level, logjson.OnGoogleCloud(getenv), logjson.Project(getenv)).With("service", name), nil
}

// Build prepares the function called name as Main serves it, without the
// server: it warns about unknown variables in environ (known lists the
// ones build reads), sets up traces from the OTEL_* variables, builds the
// handler and serves the metrics, extra included, at PathMetrics beside
// it. close releases what the handler holds, then flushes the traces.
func Build(ctx context.Context, name string, known, environ []string, getenv func(string) string, build Builder, log *slog.Logger, extra ...prometheus.Collector) (h http.Handler, close func(), err error) {
	envcheck.Warn(log, append(append([]string(nil), known...), pprofserve.EnvAddr), environ)
	tcfg, err := tracing.LoadConfig(getenv)
	if err != nil {
		return nil, nil, err
	}
	metrics, err := metricsHandler(extra...)
	if err != nil {
		return nil, nil, err
	}
	stopTracing, err := tracing.Setup(ctx, name, tcfg, log)
	if err != nil {
		return nil, nil, err
	}
	flush := func() {
		// After closeFn: the last requests' spans go too.
		fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := stopTracing(fctx); err != nil {
			log.Warn("traces not flushed", "event", tracing.EventFlushFailed, "error", err.Error())
		}
	}
	fh, closeFn, err := build(ctx, getenv, log)
	if err != nil {
		flush()
		return nil, nil, fmt.Errorf("start %s: %w", name, err)
	}
	return routes(fh, metrics), func() {
		if closeFn != nil {
			closeFn()
		}
		flush()
	}, nil
}

// run starts the function and blocks until ctx ends and the drain is
// over. When ready is not nil it receives the bound address once the
// server accepts connections.
func run(ctx context.Context, name string, known, environ []string, getenv func(string) string, build Builder, log *slog.Logger, extra []prometheus.Collector, ready chan<- net.Addr) error {
	pcfg, err := pprofserve.LoadConfig(getenv)
	if err != nil {
		return err
	}
	port := getenv("PORT")
	if port == "" {
		port = "8080"
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("PORT=%q: want a port number", port)
	}
	h, closeFn, err := Build(ctx, name, known, environ, getenv, build, log, extra...)
	if err != nil {
		return err
	}
	// After Serve's drain: the requests in flight still use what closeFn
	// releases.
	defer closeFn()
	host := getenv("HOST") // loopback locally; empty (all interfaces) on Cloud Run
	ln, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		return fmt.Errorf("listen on %s: %w", net.JoinHostPort(host, port), err)
	}
	// The profiler, only when PPROF_ADDR asks for it, on a listener of
	// its own; it ends with ctx.
	_, waitPprof, err := pprofserve.Start(ctx, pcfg, ln.Addr(), log)
	if err != nil {
		_ = ln.Close()
		return err
	}
	defer waitPprof()
	log.Info("function serving", "event", EventFunctionStarted, "addr", ln.Addr().String())
	if ready != nil {
		ready <- ln.Addr()
	}
	context.AfterFunc(ctx, func() { log.Info("function stopping", "event", EventFunctionStopping) })
	if err := httpserve.Serve(ctx, ln, h, httpserve.DefaultConfig(), log); err != nil {
		return err
	}
	log.Info("function stopped", "event", EventFunctionStopped)
	return nil
}

// routes serves metrics at PathMetrics and the function h everywhere else.
// (httpserve puts the canonical-path check in front of both.)
func routes(h, metrics http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(PathMetrics, metrics)
	mux.Handle("/", h)
	return mux
}

// PathMetrics is where every function process serves its metrics, in the
// Prometheus text format, beside the function at "/".
const PathMetrics = "/metrics"

// metricsHandler serves a registry with the Go runtime and process
// collectors, the request metrics function_requests_total and
// function_request_duration_seconds (package httpmetrics, which each
// function's handler records) and extra. No label carries a key, an id, an owner or a token.
func metricsHandler(extra ...prometheus.Collector) (http.Handler, error) {
	reg := prometheus.NewRegistry()
	for _, c := range append([]prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	}, extra...) {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	for _, c := range httpmetrics.Collectors() {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}
