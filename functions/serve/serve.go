// Package serve runs one of the payout functions as a process: it builds
// the function's handler from the environment and serves it at "/" (as
// Cloud Run functions serve it), with its metrics at PathMetrics, on
// $PORT (default 8080) and $HOST (default: every interface). The same main
// therefore runs locally as a plain process, which is what lets the
// fencing experiment SIGSTOP a real worker, and in a Cloud Run container.
//
// The server is the project's own (internal/httpserve), not
// functions-framework-go's funcframework.StartHostPort, which this package
// used until 2026-12-01. A probe of the running stack measured why it had
// to go: the framework's http.Server has no timeouts (500 half-open
// connections raised payment-resource from 23 to 522 goroutines and the
// executor from 9 to 509, held indefinitely), no shutdown hook (SIGTERM
// cut in-flight requests instead of draining them), and its ServeMux
// answered non-canonical paths ("POST /x/../submit") with a bodiless 307
// that keeps method and body, before any check of ours could run. The
// function model is unchanged: one handler at "/", $PORT, JSON logs with
// Cloud Logging's keys on Google Cloud. On SIGTERM the server stops
// accepting, answers the requests in flight (up to httpserve's
// ShutdownTimeout, 8 s, inside Cloud Run's 10 s), then closes the
// function's dependencies and exits 0.
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

// Main runs the function called name: JSON logs on stderr (level from
// LOG_LEVEL; with Cloud Logging's keys on Google Cloud, see logjson), the
// handler from build, served on $HOST:$PORT (default every interface,
// port 8080) by internal/httpserve, and its metrics, extra included, at
// PathMetrics, and Go's profiler on a loopback address of its own when
// PPROF_ADDR is set (internal/pprofserve; off by default). known lists the environment variables build reads (from
// the function's config constants): at start, every variable of the
// environment with one of envcheck.Prefixes that is not in known gets a
// WARN line (event envcheck.EventUnknownVariable). Traces are set up
// once, by internal/tracing.Setup from the standard OTEL_* variables
// (nothing exported unless they ask for OTLP), and flushed at the end;
// the function's own spans come from its main, which wraps its handler
// (tracing.Handler) and clients (tracing.Transport). When SIGINT or SIGTERM
// arrives it drains the requests in flight, calls close and returns; it
// exits the process with status 1 if the function cannot start or the
// drain had to cut requests. After the first signal a second one stops
// the process at once.
func Main(name string, known []string, build Builder, extra ...prometheus.Collector) {
	level := slog.LevelInfo
	if v := os.Getenv("LOG_LEVEL"); v != "" {
		if err := level.UnmarshalText([]byte(v)); err != nil {
			fmt.Fprintf(os.Stderr, "%s: LOG_LEVEL=%q: want debug, info, warn or error\n", name, v)
			os.Exit(1)
		}
	}
	log := logjson.NewInProject(os.Stderr, level, logjson.OnGoogleCloud(os.Getenv), logjson.Project(os.Getenv)).With("service", name)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, stop)
	if err := run(ctx, name, known, os.Environ(), os.Getenv, build, log, extra, nil); err != nil {
		log.Error("function failed", "event", EventFunctionFailed, "error", err.Error())
		os.Exit(1)
	}
}

// run starts the function and blocks until ctx ends and the drain is
// over. When ready is not nil it receives the bound address once the
// server accepts connections.
func run(ctx context.Context, name string, known, environ []string, getenv func(string) string, build Builder, log *slog.Logger, extra []prometheus.Collector, ready chan<- net.Addr) error {
	envcheck.Warn(log, append(append([]string(nil), known...), pprofserve.EnvAddr), environ)
	pcfg, err := pprofserve.LoadConfig(getenv)
	if err != nil {
		return err
	}
	tcfg, err := tracing.LoadConfig(getenv)
	if err != nil {
		return err
	}
	stopTracing, err := tracing.Setup(ctx, name, tcfg, log)
	if err != nil {
		return err
	}
	defer func() {
		// After the drain and closeFn: the last requests' spans go too.
		fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := stopTracing(fctx); err != nil {
			log.Warn("traces not flushed", "event", tracing.EventFlushFailed, "error", err.Error())
		}
	}()
	port := getenv("PORT")
	if port == "" {
		port = "8080"
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("PORT=%q: want a port number", port)
	}
	h, closeFn, err := build(ctx, getenv, log)
	if err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	if closeFn != nil {
		// After Serve's drain: the requests in flight still use what
		// closeFn releases.
		defer closeFn()
	}
	metrics, err := metricsHandler(extra...)
	if err != nil {
		return err
	}
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
	if err := httpserve.Serve(ctx, ln, routes(h, metrics), httpserve.DefaultConfig(), log); err != nil {
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
