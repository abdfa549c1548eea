package reconciler_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/reconciler"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/overload"
)

// POST /v1/reconciler/runs holds its body to the rule of every service
// (jsonhandler.DecodeEmpty): the newcomer's probe sent a body in latin1 and
// the pass ran. A refused run answers the error envelope with a stable
// code and a 4xx, and runs no pass (payment-resource is never asked for
// the listing); an empty body, or "{}" as JSON, runs one.
func TestTheRunsEndpointFollowsTheContentTypeRule(t *testing.T) {
	var listed atomic.Int64
	pay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		listed.Add(1)
		http.Error(w, "no listing here", http.StatusInternalServerError)
	}))
	defer pay.Close()
	cfg := reconciler.DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL = pay.URL, pay.URL, pay.URL
	r, err := reconciler.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, method, path, body string
		cts                      []string
		status                   int
		code                     string
	}{
		{"charset=latin1", "POST", reconciler.PathRuns, `{}`, []string{"application/json; charset=latin1"}, 415, jsonhandler.CodeUnsupportedMediaType},
		{"charset=latin1, no body", "POST", reconciler.PathRuns, ``, []string{"application/json; charset=latin1"}, 415, jsonhandler.CodeUnsupportedMediaType},
		{"a body without Content-Type", "POST", reconciler.PathRuns, `{}`, nil, 415, jsonhandler.CodeUnsupportedMediaType},
		{"text/plain", "POST", reconciler.PathRuns, `{}`, []string{"text/plain"}, 415, jsonhandler.CodeUnsupportedMediaType},
		{"Content-Type twice", "POST", reconciler.PathRuns, `{}`, []string{"application/json", "application/json"}, 400, jsonhandler.CodeInvalidRequest},
		{"a parameter", "POST", reconciler.PathRuns, `{"dryRun":true}`, []string{"application/json"}, 400, jsonhandler.CodeInvalidRequest},
		{"not JSON", "POST", reconciler.PathRuns, `run`, []string{"application/json"}, 400, jsonhandler.CodeInvalidRequest},
		{"body over the limit", "POST", reconciler.PathRuns, `{}` + strings.Repeat(" ", reconciler.MaxRunBodyBytes), []string{"application/json"}, 413, jsonhandler.CodeBodyTooLarge},
		{"GET", "GET", reconciler.PathRuns, ``, nil, 405, "METHOD_NOT_ALLOWED"},
		{"unknown path", "POST", "/v1/reconciler/run", ``, nil, 404, "NOT_FOUND"},
	} {
		req := httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body))
		for _, ct := range tc.cts {
			req.Header.Add("Content-Type", ct)
		}
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, req)
		var env jsonhandler.Envelope
		if rec.Code != tc.status || json.Unmarshal(rec.Body.Bytes(), &env) != nil || env.Error.Code != tc.code || env.Error.Message == "" {
			t.Errorf("%s: %d %s; want %d with the envelope and code %s", tc.name, rec.Code, rec.Body, tc.status, tc.code)
		}
		if n := listed.Load(); n != 0 {
			t.Fatalf("%s: the refused run started a pass (%d listing requests)", tc.name, n)
		}
	}
	for _, tc := range []struct {
		name, body string
		cts        []string
	}{
		{"no body", ``, nil},
		{"{} as JSON", `{}`, []string{"application/json; charset=utf-8"}},
	} {
		before := listed.Load()
		req := httptest.NewRequest("POST", reconciler.PathRuns, strings.NewReader(tc.body))
		for _, ct := range tc.cts {
			req.Header.Add("Content-Type", ct)
		}
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, req)
		var env jsonhandler.Envelope
		// The fake payment-resource cannot list: the pass ran and says so.
		if rec.Code != http.StatusServiceUnavailable || json.Unmarshal(rec.Body.Bytes(), &env) != nil || env.Error.Code != reconciler.CodePassNotRun || !env.Error.Retryable {
			t.Errorf("%s: %d %s; want 503 %s, retryable", tc.name, rec.Code, rec.Body, reconciler.CodePassNotRun)
		}
		// Like every 503 of the project (a probe found none).
		if ra := rec.Header().Get(overload.HeaderRetryAfter); ra != strconv.Itoa(overload.RetryAfterSeconds) {
			t.Errorf("%s: Retry-After %q; want %d", tc.name, ra, overload.RetryAfterSeconds)
		}
		if listed.Load() == before {
			t.Errorf("%s: no pass ran", tc.name)
		}
	}
}

// auditListsShown fails unless rep, as the run answers it, carries both
// audit lists as [] (docs/payout-api.md shows them always; a probe
// found them left out when the audit found nothing or did not
// run).
func auditListsShown(t *testing.T, rep reconciler.PassReport) {
	t.Helper()
	b, lists := auditLists(t, rep)
	for k, v := range lists {
		if v != "[]" {
			t.Errorf("run answer %s: %s = %q; want []", b, k, v)
		}
	}
}

// auditLists returns rep as the run answers it, and the raw JSON of its
// three audit lists by name ("" for one that is left out).
func auditLists(t *testing.T, rep reconciler.PassReport) ([]byte, map[string]string) {
	t.Helper()
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var body map[string]json.RawMessage
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatal(err)
	}
	lists := map[string]string{}
	for _, k := range []string{"railPaidNoDebit", "debitNoRailPayment", "violations"} {
		lists[k] = string(body[k])
	}
	return b, lists
}
