package railproxy_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/logjson"
)

// TestEveryRequestLineCarriesTheTraceID: every line rail-proxy writes
// while answering a traced request carries the request's trace id: the
// refusals and failures of fail() (no route, a malformed token, a bad
// body, unsigned terms, a forged token, a stale token, a duplicate, a
// stopped reference, a rail not reached) as well as the accepted
// submission's lines. Before, fail() and the terms check logged without
// the request's context, so those lines could not be joined to the trace.
func TestEveryRequestLineCarriesTheTraceID(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	down := r.proxy(func(c *railproxy.Config) { c.RailURL = deadURL(t) })
	if _, err := r.stub.Stop("po-stopped"); err != nil {
		t.Fatal(err)
	}
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithRemoteSpanContext(t.Context(),
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true}))
	unsigned := strings.Replace(body("po-x", "acct-1", 2500), `"amountMinor":2500`, `"amountMinor":2501`, 1)
	for _, tc := range []struct {
		name         string
		h            http.Handler
		method, path string
		body, token  string
		proof        bool
		status       int
	}{
		{"no route", p, "GET", "/v1/rail/nowhere", "", "", false, 404},
		{"malformed token", p, "POST", api.PathSubmissions, body("po-1", "acct-1", 2500), "abc", false, 400},
		{"bad body", p, "POST", api.PathSubmissions, `{"payoutId":`, "42", true, 400},
		{"unsigned terms", p, "POST", api.PathSubmissions, unsigned, "42", true, 403},
		{"token without proof", p, "POST", api.PathSubmissions, body("po-1", "acct-1", 2500), "42", false, 403},
		{"accepted", p, "POST", api.PathSubmissions, body("po-1", "acct-1", 2500), "42", true, 200},
		{"stale token", p, "POST", api.PathSubmissions, body("po-2", "acct-1", 2500), "41", true, 409},
		{"already submitted", p, "POST", api.PathSubmissions, body("po-1", "acct-1", 2500), "43", true, 409},
		{"stopped reference", p, "POST", api.PathSubmissions, body("po-stopped", "acct-1", 2500), "44", true, 409},
		{"rail not reached", down, "POST", api.PathSubmissions, body("po-3", "acct-1", 2500), "45", true, 503},
	} {
		before := len(r.logs.Lines(t))
		req := httptest.NewRequestWithContext(ctx, tc.method, tc.path, strings.NewReader(tc.body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(fencewire.HeaderOwner, "w")
		if tc.token != "" {
			req.Header.Set(fencewire.HeaderToken, tc.token)
		}
		if tc.proof {
			withProof(req, tc.body, []string{tc.token})
		}
		rec := httptest.NewRecorder()
		tc.h.ServeHTTP(rec, req)
		if rec.Code != tc.status {
			t.Fatalf("%s: answer %d %s; want %d", tc.name, rec.Code, rec.Body, tc.status)
		}
		lines := r.logs.Lines(t)[before:]
		if len(lines) == 0 {
			t.Fatalf("%s: no line logged; the case checks nothing", tc.name)
		}
		for _, l := range lines {
			if l[logjson.KeyTraceID] != tid.String() {
				t.Errorf("%s: line %v (event %v) has %s %v; want %s", tc.name, l["msg"], l["event"], logjson.KeyTraceID, l[logjson.KeyTraceID], tid)
			}
		}
	}
}
