// Package serve runs one of the payout functions as a process: it builds
// the function's handler from the environment, registers it with
// functions-framework-go at "/" (as Cloud Run functions serve it), with
// its metrics at PathMetrics, and serves it on $PORT. The same main therefore runs locally as a plain
// process, which is what lets the fencing experiment SIGSTOP a real worker,
// and in a Cloud Run container.
package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path"
	"strconv"
	"syscall"

	"github.com/GoogleCloudPlatform/functions-framework-go/funcframework"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/envcheck"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpjson"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/logjson"
)

// Builder makes a function's handler from the environment. close is called
// once when the process is told to stop; it must release what the handler
// holds (pools, publishers, background goroutines) and may be nil.
type Builder func(ctx context.Context, getenv func(string) string, log *slog.Logger) (h http.Handler, close func(), err error)

// Main runs the function called name: JSON logs on stderr (level from
// LOG_LEVEL; with Cloud Logging's keys on Google Cloud, see logjson), the handler from build, served on $PORT (default 8080) by
// functions-framework-go, and its metrics, extra included, at
// PathMetrics. known lists the environment variables build reads (from
// the function's config constants): at start, every variable of the
// environment with one of envcheck.Prefixes that is not in known gets a
// WARN line (event envcheck.EventUnknownVariable). It returns when SIGINT
// or SIGTERM arrives, after calling close; it exits the process with
// status 1 if the function cannot start.
func Main(name string, known []string, build Builder, extra ...prometheus.Collector) {
	level := slog.LevelInfo
	if v := os.Getenv("LOG_LEVEL"); v != "" {
		if err := level.UnmarshalText([]byte(v)); err != nil {
			fmt.Fprintf(os.Stderr, "%s: LOG_LEVEL=%q: want debug, info, warn or error\n", name, v)
			os.Exit(1)
		}
	}
	log := logjson.New(os.Stderr, level, logjson.OnGoogleCloud(os.Getenv)).With("service", name)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, name, known, os.Environ(), build, log, extra); err != nil {
		log.Error("function failed", "event", "function_failed", "error", err.Error())
		os.Exit(1)
	}
}

func run(ctx context.Context, name string, known, environ []string, build Builder, log *slog.Logger, extra []prometheus.Collector) error {
	envcheck.Warn(log, known, environ)
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("PORT=%q: want a port number", port)
	}
	h, closeFn, err := build(ctx, os.Getenv, log)
	if err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	if closeFn != nil {
		defer closeFn()
	}
	metrics, err := metricsHandler(extra...)
	if err != nil {
		return err
	}
	// One function at "/", routing /metrics itself: with FUNCTION_TARGET
	// set (Cloud Run functions), the framework serves a single function.
	if err := funcframework.RegisterHTTPFunctionContext(ctx, "/", routes(h, metrics).ServeHTTP); err != nil {
		return err
	}
	host := os.Getenv("HOST") // loopback locally; empty (all interfaces) on Cloud Run
	served := make(chan error, 1)
	// The framework's server has no shutdown hook: this goroutine ends with
	// the process, after the dependencies have been closed below.
	go func() { served <- funcframework.StartHostPort(host, port) }()
	log.Info("function serving", "event", "function_started", "host", host, "port", port)
	select {
	case err := <-served:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
		log.Info("function stopping", "event", "function_stopping")
		return nil
	}
}

// routes serves metrics at PathMetrics and the function h everywhere else,
// behind the canonical-path check.
func routes(h, metrics http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(PathMetrics, metrics)
	mux.Handle("/", h)
	return canonical(mux)
}

// PathMetrics is where every function process serves its metrics, in the
// Prometheus text format, beside the function at "/".
const PathMetrics = "/metrics"

// metricsHandler serves a registry with the Go runtime and process
// collectors, the fence points' fence_refusals_total{resource} (package
// fencing) and extra. No label carries a key, an id, an owner or a token.
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
	if err := fencing.Register(reg); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}

// canonical refuses, with the JSON error envelope, a request whose path is
// not in canonical form ("..", ".", "//"), which http.ServeMux would answer
// with a bodiless redirect.
func canonical(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if c := path.Clean(p); p == "" || p[0] != '/' || (c != p && c+"/" != p) {
			httpjson.WriteError(w, http.StatusBadRequest, httpjson.CodeInvalidRequest, fmt.Sprintf("path %q is not in canonical form", p), false)
			return
		}
		h.ServeHTTP(w, r)
	})
}
