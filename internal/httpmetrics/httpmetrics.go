// Package httpmetrics is the request middleware of the payout functions:
// Handler counts and times every request a function answers, by function,
// route pattern (never the path, so no id reaches a label) and status
// class, as function_requests_total and
// function_request_duration_seconds; Collectors returns them for the
// process's registry.
package httpmetrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric names, for the rules and the tests.
const (
	// NameRequests counts answered requests, by function, route and class.
	NameRequests = "function_requests_total"
	// NameDuration is the time to answer a request, in seconds, by
	// function and route.
	NameDuration = "function_request_duration_seconds"
)

// Label names and the route of a request no pattern matched.
const (
	LabelFunction = "function"
	LabelRoute    = "route"
	LabelClass    = "class"
	// RouteOther is the route of a request no registered pattern matched
	// (a 404 or 405 of the mux, a redirect to the canonical path).
	RouteOther = "other"
)

// Buckets are lock-server's request-duration buckets (seconds), so that
// the functions' latency and the lock's read alike.
var Buckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}

var (
	requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: NameRequests,
		Help: "Requests answered by a payout function, by function, route (the registered pattern) and status class (2xx...).",
	}, []string{LabelFunction, LabelRoute, LabelClass})
	duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    NameDuration,
		Help:    "Time for a payout function to answer a request, in seconds, by function and route (the registered pattern).",
		Buckets: Buckets,
	}, []string{LabelFunction, LabelRoute})
)

// Collectors returns the two metrics, for a registry.
func Collectors() []prometheus.Collector { return []prometheus.Collector{requests, duration} }

// Routes names the route of a request: a registered pattern, or "" when
// none matches (recorded as RouteOther). It must not return anything
// taken from the request's path or body.
type Routes func(r *http.Request) string

// MuxRoutes names a request by the pattern mux would route it to
// (http.ServeMux.Handler), asked before the request is served, so that the
// answer does not depend on what wraps or copies the request later.
func MuxRoutes(mux *http.ServeMux) Routes {
	return func(r *http.Request) string {
		_, pattern := mux.Handler(r)
		return pattern
	}
}

// OneRoute names every request pattern: for a function that is one
// handler (the executor's push endpoint).
func OneRoute(pattern string) Routes {
	return func(*http.Request) string { return pattern }
}

// Handler serves next and counts and times every request it answers under
// function and the route routes names. A handler that writes no status
// counts as 200 (what net/http sends).
func Handler(function string, routes Routes, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		route := routes(r)
		if route == "" {
			route = RouteOther
		}
		start := time.Now()
		rec := &recorder{ResponseWriter: w}
		next.ServeHTTP(rec, r)
		status := rec.status
		if status == 0 {
			status = http.StatusOK
		}
		requests.WithLabelValues(function, route, Class(status)).Inc()
		duration.WithLabelValues(function, route).Observe(time.Since(start).Seconds())
	})
}

// Class is the status class of an HTTP status: "1xx" to "5xx", and
// "other" outside 100..599.
func Class(status int) string {
	if status < 100 || status > 599 {
		return RouteOther
	}
	return strconv.Itoa(status/100) + "xx"
}

// recorder notes the first status written.
type recorder struct {
	http.ResponseWriter
	status int
}

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 && status >= 200 {
		r.status = status
	}
	r.ResponseWriter.WriteHeader(status)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// Unwrap gives http.ResponseController and http.MaxBytesReader the
// server's own writer.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
