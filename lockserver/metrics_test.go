package lockserver_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// status sends one request to h (a JSON body when body is not empty) and
// returns the status.
func status(h http.Handler, method, path, body string) int {
	ct := ""
	if body != "" {
		ct = "application/json"
	}
	return do(h, method, path, ct, body).Code
}

// counter returns lockserver_requests_total{op,code}.
func counter(t *testing.T, reg *prometheus.Registry, op, code string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "lockserver_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			l := labels(m)
			if l["op"] == op && l["code"] == code {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, p := range m.GetLabel() {
		out[p.GetName()] = p.GetValue()
	}
	return out
}

// TestMetricsCountOutcomesAndCarryNoKeysOwnersOrTokens drives many keys,
// owners and tokens through a Server with metrics, then checks the counts
// by outcome and the cardinality rule: no label value is a key, an owner
// or a token, and the number of series does not grow with the keys.
func TestMetricsCountOutcomesAndCarryNoKeysOwnersOrTokens(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := lockserver.DefaultServerConfig()
	cfg.Registry = reg
	h := serverWith(t, memstore.New(nil), cfg)
	secret := map[string]bool{} // every key, owner and token sent
	series := func() int {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, f := range fams {
			n += len(f.GetMetric())
		}
		return n
	}
	round := func(keys int, prefix string) {
		for i := range keys {
			key, owner := fmt.Sprintf("payout:%s-%d", prefix, i), fmt.Sprintf("worker-%s-%d", prefix, i)
			secret[key], secret[owner] = true, true
			body := fmt.Sprintf(`{"owner":%q,"ttlMs":30000}`, owner)
			if c := status(h, "POST", "/v1/locks/"+key+"/acquire", body); c != 200 {
				t.Fatalf("acquire %s: %d", key, c)
			}
			if c := status(h, "POST", "/v1/locks/"+key+"/acquire", `{"owner":"other","ttlMs":30000}`); c != 409 {
				t.Fatalf("second acquire %s: %d", key, c)
			}
			token := strconv.Itoa(1000 + i)
			secret[token] = true
			status(h, "POST", "/v1/locks/"+key+"/release", fmt.Sprintf(`{"owner":%q,"token":%s}`, owner, token))
			status(h, "GET", "/v1/locks/"+key, "")
		}
		status(h, "POST", "/v1/locks/bad%20key/acquire", `{"owner":"x","ttlMs":30000}`)
		status(h, "GET", "/v1/no/such/route-"+prefix, "")
		status(h, "GET", "/v1/locks/a/../b", "")
		status(h, "GET", "/healthz", "")
	}
	round(10, "a")
	small := series()
	round(100, "b")
	if big := series(); big != small {
		t.Errorf("%d series after 10 keys, %d after 110: series grow with keys", small, big)
	}

	if got := counter(t, reg, "acquire", "OK"); got != 110 {
		t.Errorf(`requests{op="acquire",code="OK"} = %v; want 110`, got)
	}
	if got := counter(t, reg, "acquire", "LOCK_HELD"); got != 110 {
		t.Errorf(`requests{op="acquire",code="LOCK_HELD"} = %v; want 110`, got)
	}
	if got := counter(t, reg, "acquire", "INVALID_REQUEST"); got != 2 {
		t.Errorf(`requests{op="acquire",code="INVALID_REQUEST"} = %v; want 2`, got)
	}
	if got := counter(t, reg, "other", "NOT_FOUND"); got != 2 {
		t.Errorf(`requests{op="other",code="NOT_FOUND"} = %v; want 2`, got)
	}
	if got := counter(t, reg, "inspect", "OK"); got != 110 {
		t.Errorf(`requests{op="inspect",code="OK"} = %v; want 110`, got)
	}

	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			for name, v := range labels(m) {
				if name != "op" && name != "code" {
					t.Errorf("%s has label %q; only op and code are allowed", f.GetName(), name)
				}
				if secret[v] {
					t.Errorf("%s{%s=%q} carries a key, owner or token", f.GetName(), name, v)
				}
			}
		}
	}

	// The endpoint serves the same registry, and scraping it is not counted.
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", lockserver.PathMetrics, nil))
	b, _ := io.ReadAll(w.Body)
	if w.Code != 200 || !strings.Contains(string(b), `lockserver_requests_total{code="OK",op="acquire"} 110`) {
		t.Fatalf("GET %s = %d:\n%s", lockserver.PathMetrics, w.Code, b)
	}
	if strings.Contains(string(b), `op="metrics"`) {
		t.Error("scrapes of /metrics are counted")
	}
}

func TestNoRegistryNoMetricsRoute(t *testing.T) {
	h := serverWith(t, memstore.New(nil), lockserver.DefaultServerConfig())
	if c := status(h, "GET", lockserver.PathMetrics, ""); c != 404 {
		t.Fatalf("GET %s without a registry = %d; want 404", lockserver.PathMetrics, c)
	}
}

// TestMetricsKeepErrorHandling: with metrics on, an oversized body still
// closes the connection (http.MaxBytesReader reaches the server's own
// writer), and an error whose message echoes a long input is still counted
// under its code.
func TestMetricsKeepErrorHandling(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := lockserver.DefaultServerConfig()
	cfg.Registry = reg
	h := serverWith(t, memstore.New(nil), cfg)
	srv := httptest.NewServer(h)
	defer srv.Close()
	body := `{"owner":"` + strings.Repeat("a", 64<<10) + `","ttlMs":30000}`
	resp, err := http.Post(srv.URL+"/v1/locks/k/acquire", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != 413 || !resp.Close {
		t.Errorf("oversized body: status %d, connection closed %v; want 413 and closed", resp.StatusCode, resp.Close)
	}
	if got := counter(t, reg, "acquire", "BODY_TOO_LARGE"); got != 1 {
		t.Errorf(`requests{op="acquire",code="BODY_TOO_LARGE"} = %v; want 1`, got)
	}
	status(h, "POST", "/v1/locks/k/"+strings.Repeat("x", 1100), `{"owner":"a","ttlMs":30000}`)
	if got := counter(t, reg, "other", "NOT_FOUND"); got != 1 {
		t.Errorf(`requests{op="other",code="NOT_FOUND"} after a long unknown op = %v; want 1`, got)
	}
	status(h, "POST", "/v1/locks/k/acquire", `{"owner":"a","ttlMs":30000,"`+strings.Repeat("f", 1100)+`":1}`)
	if got := counter(t, reg, "acquire", "INVALID_REQUEST"); got != 1 {
		t.Errorf(`requests{op="acquire",code="INVALID_REQUEST"} after a long unknown field = %v; want 1`, got)
	}
}

// TestWaitingAcquiresHaveAnOpOfTheirOwn: a long-poll acquire is counted
// as acquire_wait, so its waiting stays out of acquire's latency.
func TestWaitingAcquiresHaveAnOpOfTheirOwn(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := lockserver.DefaultServerConfig()
	cfg.Registry = reg
	h := serverWith(t, memstore.New(nil), cfg)
	do(h, "POST", "/v1/locks/payout:acct-m/acquire", "application/json", `{"owner":"a","ttlMs":30000}`)
	do(h, "POST", "/v1/locks/payout:acct-m/acquire", "application/json", `{"owner":"b","ttlMs":30000,"waitMs":10}`)
	if got := counter(t, reg, "acquire", "OK"); got != 1 {
		t.Errorf("acquire OK = %v, want 1", got)
	}
	if got := counter(t, reg, "acquire_wait", "LOCK_HELD"); got != 1 {
		t.Errorf("acquire_wait LOCK_HELD = %v, want 1", got)
	}
	if got := counter(t, reg, "acquire", "LOCK_HELD"); got != 0 {
		t.Errorf("acquire LOCK_HELD = %v, want 0: the waiting acquire was counted as a plain one", got)
	}
}
