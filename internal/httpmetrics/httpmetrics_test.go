package httpmetrics_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpmetrics"
)

// TestRequestsAreCountedByPatternNotPath: two calls of one route with
// different ids are one series, labelled with the registered pattern;
// a path no pattern matches is "other"; the class follows the status,
// and a handler that writes no status counts as 2xx.
func TestRequestsAreCountedByPatternNotPath(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/payouts/{id}/claim", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") == "p-conflict" {
			w.WriteHeader(http.StatusConflict)
		}
	})
	mux.HandleFunc("GET /v1/plain", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) })
	// The function wraps its mux and is itself wrapped by something that
	// copies the request (as otelhttp does): the route must survive.
	h := httpmetrics.Handler("test-fn", httpmetrics.MuxRoutes(mux), mux)
	outer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, r.WithContext(r.Context())) })
	for _, req := range []*http.Request{
		httptest.NewRequest("POST", "/v1/payouts/p-1/claim", nil),
		httptest.NewRequest("POST", "/v1/payouts/p-2/claim", nil),
		httptest.NewRequest("POST", "/v1/payouts/p-conflict/claim", nil),
		httptest.NewRequest("GET", "/v1/plain", nil),
		httptest.NewRequest("GET", "/v1/acct-secret", nil),
	} {
		outer.ServeHTTP(httptest.NewRecorder(), req)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(httpmetrics.Collectors()...)
	want := `
# HELP function_requests_total Requests answered by a payout function, by function, route (the registered pattern) and status class (2xx...).
# TYPE function_requests_total counter
function_requests_total{class="2xx",function="test-fn",route="GET /v1/plain"} 1
function_requests_total{class="2xx",function="test-fn",route="POST /v1/payouts/{id}/claim"} 2
function_requests_total{class="4xx",function="test-fn",route="POST /v1/payouts/{id}/claim"} 1
function_requests_total{class="4xx",function="test-fn",route="other"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), httpmetrics.NameRequests); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(httpmetrics.Collectors()[1], httpmetrics.NameDuration); n != 3 {
		t.Errorf("%d duration series; want 3 (one per route)", n)
	}
}

func TestClass(t *testing.T) {
	for status, want := range map[int]string{101: "1xx", 200: "2xx", 307: "3xx", 409: "4xx", 503: "5xx", 0: "other", 600: "other"} {
		if got := httpmetrics.Class(status); got != want {
			t.Errorf("Class(%d) = %q; want %q", status, got, want)
		}
	}
}
