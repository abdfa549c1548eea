package serve

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/envcheck"
)

func TestNonCanonicalPathsGetTheEnvelope(t *testing.T) {
	h := canonical(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	for target, want := range map[string]int{
		"/v1/payouts/p-1":              http.StatusTeapot,
		"/v1/payouts/":                 http.StatusTeapot,
		"/v1/payouts/../../etc/passwd": http.StatusBadRequest,
		"/v1//payouts":                 http.StatusBadRequest,
		"/v1/./payouts":                http.StatusBadRequest,
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", target, nil))
		if rec.Code != want {
			t.Errorf("GET %s: %d; want %d", target, rec.Code, want)
		}
		if want == http.StatusBadRequest && rec.Header().Get("Content-Type") != "application/json" {
			t.Errorf("GET %s: not a JSON envelope", target)
		}
	}
}

// TestMetricsCountFenceRefusals: the registry every function process serves
// at /metrics counts fenced_out events by resource, and carries neither the
// resource id, the tokens nor the owner.
func TestMetricsCountFenceRefusals(t *testing.T) {
	h, err := metricsHandler()
	if err != nil {
		t.Fatal(err)
	}
	scrape := func() string {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", PathMetrics, nil))
		if w.Code != 200 {
			t.Fatalf("GET %s = %d", PathMetrics, w.Code)
		}
		return w.Body.String()
	}
	value := func(body, series string) float64 {
		for _, line := range strings.Split(body, "\n") {
			if v, ok := strings.CutPrefix(line, series+" "); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatalf("%s: %v", line, err)
				}
				return f
			}
		}
		t.Fatalf("no series %s in:\n%s", series, body)
		return 0
	}
	before := scrape()
	r := fencing.Refusal{Resource: "rail", ResourceID: "acct-secret-7", PresentedToken: 41, HighestToken: 42, Owner: "worker-secret"}
	r.Log(slog.New(slog.DiscardHandler))
	r.Log(slog.New(slog.DiscardHandler))
	fencing.Refusal{Resource: "something-new"}.Log(slog.New(slog.DiscardHandler))
	after := scrape()
	if d := value(after, `fence_refusals_total{resource="rail"}`) - value(before, `fence_refusals_total{resource="rail"}`); d != 2 {
		t.Errorf("rail refusals went up by %v; want 2", d)
	}
	if value(after, `fence_refusals_total{resource="other"}`) < 1 {
		t.Errorf("a refusal of an unlisted resource was not counted as other")
	}
	value(after, `fence_refusals_total{resource="account"}`) // present before any refusal
	for _, secret := range []string{"acct-secret-7", "worker-secret", "something-new", `"41"`, `"42"`} {
		if strings.Contains(after, secret) {
			t.Errorf("/metrics carries %s", secret)
		}
	}
}

func TestRoutesServeMetricsBesideTheFunction(t *testing.T) {
	fn := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	h := routes(fn, metrics)
	for target, want := range map[string]int{
		PathMetrics:          http.StatusOK,
		"/":                  http.StatusTeapot,
		"/v1/payouts/p-1":    http.StatusTeapot,
		"/v1/../metrics":     http.StatusBadRequest,
		PathMetrics + "/sub": http.StatusTeapot,
	} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", target, nil))
		if w.Code != want {
			t.Errorf("GET %s = %d; want %d", target, w.Code, want)
		}
	}
}

// TestRunWarnsAboutUnknownVariables: run logs one config_unknown_variable
// WARN line per prefixed variable the function does not read, before it
// builds the function (here a build that fails).
func TestRunWarnsAboutUnknownVariables(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	build := func(context.Context, func(string) string, *slog.Logger) (http.Handler, func(), error) {
		return nil, nil, errors.New("no function here")
	}
	err := run(t.Context(), "test", []string{"RAIL_URL"}, []string{"RAIL_UR=http://x", "RAIL_URL=http://y", "PATH=/bin"}, build, log, nil)
	if err == nil {
		t.Fatal("run with a failing build returned nil")
	}
	out := buf.String()
	if strings.Count(out, envcheck.EventUnknownVariable) != 1 || !strings.Contains(out, `"variable":"RAIL_UR"`) || !strings.Contains(out, `"didYouMean":"RAIL_URL"`) {
		t.Errorf("log %s; want one %s line for RAIL_UR suggesting RAIL_URL", out, envcheck.EventUnknownVariable)
	}
}
