package railstub_test

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/fuzztest"
)

// stubState is what a request may change in a Stub: its records and its
// fault settings.
func stubState(t *testing.T, s *railstub.Stub) string {
	t.Helper()
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("GET", "/admin/faults", nil))
	recs, _ := json.Marshal(s.Submissions(""))
	return fmt.Sprintf("faults %s records %s", strings.TrimSpace(rec.Body.String()), recs)
}

// FuzzRailStub sends one request with an arbitrary method, path, content
// type and body to a fresh rail-stub holding one submission, and checks
// the answer's properties (package fuzztest) and that a refused request
// recorded nothing and changed no fault setting.
func FuzzRailStub(f *testing.F) {
	const ct = "application/json"
	for _, s := range []struct {
		method         uint8
		path, ct, body string
	}{
		{0, rail.PathSubmit, ct, okBody},
		{0, rail.PathSubmit, ct, `{"payoutId":"po-2","accountId":"acct-1","amountMinor":2500,"currency":"EUR","reference":"po-2"}`},
		{1, rail.PathJournal, "", ``},
		{1, "/admin/faults", "", ``},
		{0, "/admin/faults", ct, `{"latencyMs":0,"failNext":1,"mode":"error"}`},
		{0, "/admin/faults", ct, `{"latencyMs":-1}`},
		{0, "/admin/faults", ct, `{"failNext":1,"mode":"explode"}`},
		{0, rail.PathSubmit, ct, `{"payoutId":"po-1","accountId":"acct-1","amountMinor":0,"currency":"EUR","reference":"po-1"}`},
		{0, rail.PathSubmit, ct, `{"payoutId":"po-1","accountId":"acct-1","amountMinor":1,"currency":"eur","reference":"po-1"}`},
		{0, rail.PathSubmit, ct, `{"payoutId":"\xff","accountId":"acct-1","amountMinor":1,"currency":"EUR","reference":"po-1"}`},
		{0, rail.PathSubmit, ct, `{"payoutId":"po-1","accountId":"acct-1","amountMinor":1,"currency":"EUR"}`},
		{0, rail.PathSubmit, ct, okBody + ` {}`},
		{0, rail.PathSubmit, "text/plain", okBody},
		{0, rail.PathSubmit, ct, `[]`},
		{1, rail.PathSubmit, "", ``},
		{3, "/admin/faults", ct, `{}`},
		{0, "/nope", ct, `{}`},
		{0, rail.PathSubmit + "?dryRun=1", ct, okBody},
		{1, rail.PathJournal + "?payout=po-1", "", ``},
		{0, "/x/.." + rail.PathSubmit, ct, okBody},
		{0, rail.PathSubmit, ct, `{"payoutId":"po-1","accountId":"acct-1","amountMinor":1e30,"currency":"EUR","reference":"po-1"}`},
	} {
		f.Add(s.method, s.path, s.ct, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, method uint8, path, contentType string, body []byte) {
		if !fuzztest.Canonical(path) {
			// http.ServeMux redirects a non-canonical path; the server
			// constructor refuses it first.
			return
		}
		req, ok := fuzztest.NewRequest(method, path, body, "Content-Type", contentType)
		if !ok {
			return
		}
		s, err := railstub.New(railstub.DefaultConfig(), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		s.ServeHTTP(httptest.NewRecorder(), postJSON(rail.PathSubmit, okBody))
		before := stubState(t, s)
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		a := fuzztest.FromRecorder(rec)
		if err := fuzztest.Check(a, fuzztest.Options{}, path, contentType, string(body)); err != nil {
			t.Fatalf("%s %q: %v", req.Method, path, err)
		}
		if a.Status >= 400 {
			if after := stubState(t, s); after != before {
				t.Fatalf("refused %s %q (%d) changed the stub:\nbefore %s\nafter  %s", req.Method, path, a.Status, before, after)
			}
		}
	})
}
