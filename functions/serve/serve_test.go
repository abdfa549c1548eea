package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/envcheck"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpmetrics"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
)

// TestMetricsCountFenceRefusals: the registry of a process with a fence
// point (its Collectors include fencing.Collectors, as payment-resource's
// and rail-proxy's do) counts fenced_out events by resource, and carries
// neither the resource id, the tokens nor the owner. A process without
// one (no extra collectors: the executor, rail-stub) serves neither fence
// metric.
func TestMetricsCountFenceRefusals(t *testing.T) {
	plain, err := metricsHandler()
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	plain.ServeHTTP(w, httptest.NewRequest("GET", PathMetrics, nil))
	for _, name := range []string{"fence_refusals_total", "fence_unverified_tokens_total"} {
		if strings.Contains(w.Body.String(), name) {
			t.Errorf("a process without a fence point serves %s", name)
		}
	}
	h, err := metricsHandler(fencing.Collectors()...)
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
	r.Log(context.Background(), slog.New(slog.DiscardHandler))
	r.Log(context.Background(), slog.New(slog.DiscardHandler))
	fencing.Refusal{Resource: "something-new"}.Log(context.Background(), slog.New(slog.DiscardHandler))
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
	err := run(t.Context(), "test", []string{"RAIL_URL"}, []string{"RAIL_UR=http://x", "RAIL_URL=http://y", "PATH=/bin"}, func(string) string { return "" }, build, log, nil, nil)
	if err == nil {
		t.Fatal("run with a failing build returned nil")
	}
	out := buf.String()
	if strings.Count(out, envcheck.EventUnknownVariable) != 1 || !strings.Contains(out, `"variable":"RAIL_UR"`) || !strings.Contains(out, `"didYouMean":"RAIL_URL"`) {
		t.Errorf("log %s; want one %s line for RAIL_UR suggesting RAIL_URL", out, envcheck.EventUnknownVariable)
	}
}

// TestRunServesThroughTheHardenedServer runs a function whose handler is
// an http.ServeMux, as payment-resource's and rail-stub's are, through the
// real server of run: a path that is not canonical gets 400 with the
// envelope (the mux alone would redirect it with a bodiless 307), metrics
// and the function answer beside it, and a stop returns nil after closing
// the function's dependencies.
func TestRunServesThroughTheHardenedServer(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+rail.PathSubmit, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	mux.HandleFunc("GET /v1/audit", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	closed := make(chan struct{})
	build := func(context.Context, func(string) string, *slog.Logger) (http.Handler, func(), error) {
		return mux, func() { close(closed) }, nil
	}
	env := map[string]string{"HOST": "127.0.0.1", "PORT": "0"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, "test", nil, nil, func(k string) string { return env[k] }, build, slog.New(slog.DiscardHandler), nil, ready)
	}()
	var base string
	select {
	case addr := <-ready:
		base = "http://" + addr.String()
	case err := <-done:
		t.Fatalf("run: %v", err)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{"POST", rail.PathSubmit, http.StatusTeapot},
		{"GET", "/v1/audit", http.StatusTeapot},
		{"GET", PathMetrics, http.StatusOK},
		{"POST", "/x/.." + rail.PathSubmit, http.StatusBadRequest},
		{"GET", "/v1/payouts/x/../../audit", http.StatusBadRequest},
		{"GET", "/v1//audit", http.StatusBadRequest},
		{"GET", "/v1/../metrics", http.StatusBadRequest},
	} {
		req, err := http.NewRequest(tc.method, base+tc.path, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s %s = %d %s; want %d", tc.method, tc.path, resp.StatusCode, body, tc.want)
			continue
		}
		if tc.want == http.StatusBadRequest {
			var env jsonhandler.Envelope
			if err := json.Unmarshal(body, &env); err != nil || env.Error.Code != jsonhandler.CodeInvalidRequest {
				t.Errorf("%s %s: body %s; want the envelope with %s", tc.method, tc.path, body, jsonhandler.CodeInvalidRequest)
			}
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run after a stop = %v; want nil", err)
	}
	select {
	case <-closed:
	default:
		t.Error("run returned without closing the function's dependencies")
	}
}

// TestMetricsServeTheRequestMetrics: the registry of every function
// process serves the request metrics the functions' handlers record.
func TestMetricsServeTheRequestMetrics(t *testing.T) {
	h, err := metricsHandler()
	if err != nil {
		t.Fatal(err)
	}
	httpmetrics.Handler("serve-test", httpmetrics.OneRoute("/x"), http.NotFoundHandler()).
		ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/x/secret-id", nil))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", PathMetrics, nil))
	for _, want := range []string{
		httpmetrics.NameRequests + `{class="4xx",function="serve-test",route="/x"} 1`,
		httpmetrics.NameDuration + `_count{function="serve-test",route="/x"} 1`,
	} {
		if !strings.Contains(w.Body.String(), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
