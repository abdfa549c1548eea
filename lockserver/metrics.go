package lockserver

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
)

// PathMetrics is where a Server with a ServerConfig.Registry serves its
// metrics, in the Prometheus text format.
const PathMetrics = "/metrics"

// Label values are bounded by construction: an operation name from the
// fixed list below and an error code from package api (or "OK"), never a
// lock key, owner or token (those are in the logs; see the cardinality
// rule in docs/lock-service.md).
const (
	opOther   = "other"
	codeOK    = "OK"
	codeOther = "OTHER"
)

// opAcquireWait is the op of an acquire with a wait (a long-poll): its
// duration is mostly waiting, so it is kept out of acquire's latency
// (and the SLO read from it).
const opAcquireWait = "acquire_wait"

var knownOps = map[string]bool{
	"acquire": true, "renew": true, "release": true, "revoke": true,
	"inspect": true, "health": true, "ready": true,
}

var knownCodes = func() map[api.Code]bool {
	m := map[api.Code]bool{codeOK: true}
	for _, c := range []api.Code{
		api.CodeLockHeld, api.CodeLeaseNotHeld, api.CodeStaleToken, api.CodeInvalidRequest,
		api.CodeBodyTooLarge, api.CodeUnsupportedMediaType, api.CodeNotFound,
		api.CodeMethodNotAllowed, api.CodeBackendUnavailable, api.CodeBackendRestored, api.CodeOverloaded, api.CodeInternal,
		api.CodeRequestCancelled,
	} {
		m[c] = true
	}
	return m
}()

// metrics are the Server's request metrics:
//
//	lockserver_requests_total{op, code}          counter
//	lockserver_request_duration_seconds{op}      histogram, seconds
//
// op is acquire, acquire_wait (an acquire with waitMs), renew, release,
// revoke, inspect, health, ready or other;
// code is OK or the error envelope's code.
type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockserver_requests_total",
			Help: "Lock API requests answered, by operation and outcome (OK or the error envelope's code).",
		}, []string{"op", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "lockserver_request_duration_seconds",
			Help:    "Time to answer a lock API request, backend included, in seconds.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"op"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// observe serves r through next and records it.
func (m *metrics) observe(w http.ResponseWriter, r *http.Request, next http.Handler) {
	start := time.Now()
	rec := &recorder{ResponseWriter: w, status: http.StatusOK}
	next.ServeHTTP(rec, r)
	op := opOf(r)
	if rec.op != "" {
		op = rec.op
	}
	m.requests.WithLabelValues(op, rec.code()).Inc()
	m.duration.WithLabelValues(op).Observe(time.Since(start).Seconds())
}

// opOf names the operation of a request the mux has routed (it sets
// r.Pattern and the path values on r).
func opOf(r *http.Request) string {
	switch r.Pattern {
	case api.PathLockPrefix + "{key}/{op}":
		if op := r.PathValue("op"); knownOps[op] {
			return op
		}
	case api.PathLockPrefix + "{key}":
		return "inspect"
	case api.PathHealth:
		return "health"
	case api.PathReady:
		return "ready"
	}
	return opOther
}

// recorder notes the status, and the error code that writeError reports
// to it (every error of the Server goes through writeError).
type recorder struct {
	http.ResponseWriter
	status  int
	errCode api.Code
	op      string // set by the handler when opOf's answer is too coarse
}

// noteOp records op as the request's operation, for a handler whose
// route's name is too coarse (acquire with a wait). w may be any writer.
func noteOp(w http.ResponseWriter, op string) {
	if rec, ok := w.(*recorder); ok {
		rec.op = op
	}
}

func (r *recorder) WriteHeader(status int) {
	r.status = status
	r.ResponseWriter.WriteHeader(status)
}

// Unwrap gives http.ResponseController and http.MaxBytesReader (through
// jsonhandler) the server's own writer.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// noteError records the code of the error envelope about to be written.
func (r *recorder) noteError(code api.Code) { r.errCode = code }

// code is OK for a success, else the envelope's code if it is a known one,
// else OTHER.
func (r *recorder) code() string {
	switch {
	case r.status < 400:
		return codeOK
	case knownCodes[r.errCode]:
		return string(r.errCode)
	}
	return codeOther
}

// metricsHandler serves the registry's metrics.
func metricsHandler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{})
}
