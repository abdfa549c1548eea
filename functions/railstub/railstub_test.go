package railstub_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
)

const okBody = `{"payoutId":"po-1","accountId":"acct-1","amountMinor":2500,"currency":"EUR","reference":"po-1"}`

func newStub(t *testing.T, cfg railstub.Config) *railstub.Stub {
	t.Helper()
	s, err := railstub.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func do(h http.Handler, method, path, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func answerOf(t *testing.T, rec *httptest.ResponseRecorder) rail.SubmitAnswer {
	t.Helper()
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d, body %s; want 200", rec.Code, rec.Body)
	}
	var a rail.SubmitAnswer
	if err := json.Unmarshal(rec.Body.Bytes(), &a); err != nil {
		t.Fatalf("decode answer %q: %v", rec.Body, err)
	}
	return a
}

func envelopeOf(t *testing.T, rec *httptest.ResponseRecorder) jsonhandler.Body {
	t.Helper()
	var env jsonhandler.Envelope
	if err := json.Unmarshal(rec.Body.Bytes(), &env); err != nil || env.Error.Code == "" {
		t.Fatalf("body %q is not an error envelope (err %v)", rec.Body, err)
	}
	return env.Error
}

func TestDuplicateSubmissionIsASecondPayment(t *testing.T) {
	s := newStub(t, railstub.DefaultConfig())
	first := answerOf(t, do(s, "POST", rail.PathSubmit, okBody))
	second := answerOf(t, do(s, "POST", rail.PathSubmit, okBody))
	if first.Status != rail.StatusAck || second.Status != rail.StatusAck {
		t.Fatalf("answers %+v, %+v; want both ACK", first, second)
	}
	if first.RailRef != "rail-000001" || second.RailRef != "rail-000002" {
		t.Fatalf("railRefs %q, %q; want rail-000001, rail-000002", first.RailRef, second.RailRef)
	}
	recs := s.Submissions("po-1")
	if len(recs) != 2 {
		t.Fatalf("got %d records of po-1, want 2: the rail has no idempotency key", len(recs))
	}
	for i, r := range recs {
		if r.Seq != int64(i+1) || r.Request.AmountMinor != 2500 || r.Answer.Status != rail.StatusAck || r.Withheld {
			t.Errorf("record %d = %+v", i, r)
		}
	}
}

func TestDeclineRules(t *testing.T) {
	cfg := railstub.DefaultConfig()
	cfg.DeclineOverMinor = 10_000
	cfg.DeclineAccounts = []string{"acct-blocked"}
	s := newStub(t, cfg)
	for _, tc := range []struct {
		name, account string
		amount        int64
		want          string
	}{
		{"amount at the limit", "acct-1", 10_000, rail.StatusAck},
		{"amount over the limit", "acct-1", 10_001, rail.StatusDecline},
		{"declined account", "acct-blocked", 1, rail.StatusDecline},
		{"other account", "acct-2", 1, rail.StatusAck},
	} {
		body, _ := json.Marshal(rail.SubmitRequest{PayoutID: "po-" + tc.name, AccountID: tc.account, AmountMinor: tc.amount, Currency: "EUR", Reference: "r"})
		if got := answerOf(t, do(s, "POST", rail.PathSubmit, string(body))).Status; got != tc.want {
			t.Errorf("%s: status %s, want %s", tc.name, got, tc.want)
		}
	}
	if got := len(s.Submissions("")); got != 4 {
		t.Fatalf("got %d records, want 4: declines are recorded too", got)
	}
}

func TestBadInputIsRefusedAndNotRecorded(t *testing.T) {
	s := newStub(t, railstub.DefaultConfig())
	valid := map[string]any{"payoutId": "po-1", "accountId": "acct-1", "amountMinor": 1, "currency": "EUR", "reference": "po-1"}
	with := func(k string, v any) string {
		m := map[string]any{}
		for kk, vv := range valid {
			m[kk] = vv
		}
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"malformed JSON", "POST", rail.PathSubmit, `{"payoutId":`, 400, jsonhandler.CodeInvalidRequest},
		{"empty body", "POST", rail.PathSubmit, ``, 400, jsonhandler.CodeInvalidRequest},
		{"unknown field", "POST", rail.PathSubmit, with("token", 7), 400, jsonhandler.CodeInvalidRequest},
		{"missing payoutId", "POST", rail.PathSubmit, with("payoutId", nil), 400, jsonhandler.CodeInvalidRequest},
		{"missing accountId", "POST", rail.PathSubmit, with("accountId", nil), 400, jsonhandler.CodeInvalidRequest},
		{"missing amount", "POST", rail.PathSubmit, with("amountMinor", nil), 400, jsonhandler.CodeInvalidRequest},
		{"zero amount", "POST", rail.PathSubmit, with("amountMinor", 0), 400, jsonhandler.CodeInvalidRequest},
		{"negative amount", "POST", rail.PathSubmit, with("amountMinor", -5), 400, jsonhandler.CodeInvalidRequest},
		{"fractional amount", "POST", rail.PathSubmit, with("amountMinor", 1.5), 400, jsonhandler.CodeInvalidRequest},
		{"lower-case currency", "POST", rail.PathSubmit, with("currency", "eur"), 400, jsonhandler.CodeInvalidRequest},
		{"long currency", "POST", rail.PathSubmit, with("currency", "EURO"), 400, jsonhandler.CodeInvalidRequest},
		{"unassigned currency", "POST", rail.PathSubmit, with("currency", "ZZZ"), 400, jsonhandler.CodeInvalidRequest},
		{"no-currency code", "POST", rail.PathSubmit, with("currency", "XXX"), 400, jsonhandler.CodeInvalidRequest},
		{"missing reference", "POST", rail.PathSubmit, with("reference", nil), 400, jsonhandler.CodeInvalidRequest},
		// The newcomer's probe 11: each was recorded, rewritten or as sent.
		{"reference not UTF-8", "POST", rail.PathSubmit, "{\"payoutId\":\"po-1\",\"accountId\":\"acct-1\",\"amountMinor\":1,\"currency\":\"EUR\",\"reference\":\"po-\xff1\"}", 400, jsonhandler.CodeInvalidRequest},
		{"reference with an escaped lone surrogate", "POST", rail.PathSubmit, `{"payoutId":"po-1","accountId":"acct-1","amountMinor":1,"currency":"EUR","reference":"po-\udc001"}`, 400, jsonhandler.CodeInvalidRequest},
		{"reference with NUL", "POST", rail.PathSubmit, with("reference", "p-\x001"), 400, jsonhandler.CodeInvalidRequest},
		{"reference with a newline", "POST", rail.PathSubmit, with("reference", "p-1\nACK"), 400, jsonhandler.CodeInvalidRequest},
		{"payoutId with NUL", "POST", rail.PathSubmit, with("payoutId", "p-\x001"), 400, jsonhandler.CodeInvalidRequest},
		{"accountId with a newline", "POST", rail.PathSubmit, with("accountId", "acct\n1"), 400, jsonhandler.CodeInvalidRequest},
		{"stop order reference not UTF-8", "POST", rail.PathStops, "{\"reference\":\"p-\xff\"}", 400, jsonhandler.CodeInvalidRequest},
		{"stop order reference with NUL", "POST", rail.PathStops, `{"reference":"p-\u00001"}`, 400, jsonhandler.CodeInvalidRequest},
		{"stop order reference with a newline", "POST", rail.PathStops, `{"reference":"p-1\n"}`, 400, jsonhandler.CodeInvalidRequest},
		{"faults: failNext of int64's maximum", "POST", "/admin/faults", `{"failNext":9223372036854775807,"mode":"error"}`, 400, jsonhandler.CodeInvalidRequest},
		{"faults: failNext above the bound", "POST", "/admin/faults", `{"failNext":10001,"mode":"error"}`, 400, jsonhandler.CodeInvalidRequest},
		{"oversized body", "POST", rail.PathSubmit, with("reference", strings.Repeat("x", rail.MaxBodyBytes)), 413, jsonhandler.CodeBodyTooLarge},
		{"wrong method", "GET", rail.PathSubmit, ``, 405, rail.CodeMethodNotAllowed},
		{"unknown route", "POST", "/pay", okBody, 404, rail.CodeNotFound},
		{"faults: unknown mode", "POST", "/admin/faults", `{"failNext":1,"mode":"explode"}`, 400, jsonhandler.CodeInvalidRequest},
		{"faults: failNext without mode", "POST", "/admin/faults", `{"failNext":1}`, 400, jsonhandler.CodeInvalidRequest},
		{"faults: negative latency", "POST", "/admin/faults", `{"latencyMs":-1}`, 400, jsonhandler.CodeInvalidRequest},
		{"faults: wrong method", "DELETE", "/admin/faults", ``, 405, rail.CodeMethodNotAllowed},
		{"submissions: wrong method", "POST", rail.PathJournal, ``, 405, rail.CodeMethodNotAllowed},
	} {
		rec := do(s, tc.method, tc.path, tc.body)
		if rec.Code != tc.status {
			t.Errorf("%s: status %d, want %d (body %s)", tc.name, rec.Code, tc.status, rec.Body)
			continue
		}
		if got := envelopeOf(t, rec); got.Code != tc.code || got.Retryable {
			t.Errorf("%s: envelope %+v, want code %s, not retryable", tc.name, got, tc.code)
		}
	}
	if got := s.Submissions(""); len(got) != 0 {
		t.Fatalf("bad input was recorded: %+v", got)
	}
	if f := do(s, "GET", "/admin/faults", ""); !strings.Contains(f.Body.String(), `"failNext":0`) {
		t.Fatalf("refused fault settings changed the faults: %s", f.Body)
	}
	// The first valid submission after all that is still number one.
	if ref := answerOf(t, do(s, "POST", rail.PathSubmit, okBody)).RailRef; ref != "rail-000001" {
		t.Fatalf("railRef %s, want rail-000001", ref)
	}
}

func TestErrorFaultAnswers503WithoutRecording(t *testing.T) {
	s := newStub(t, railstub.DefaultConfig())
	if rec := do(s, "POST", "/admin/faults", `{"failNext":2,"mode":"error"}`); rec.Code != 200 {
		t.Fatalf("set faults: %d %s", rec.Code, rec.Body)
	}
	for i := range 2 {
		rec := do(s, "POST", rail.PathSubmit, okBody)
		if rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("submission %d: status %d, want 503", i+1, rec.Code)
		}
		if got := envelopeOf(t, rec); got.Code != rail.CodeUnavailable {
			t.Fatalf("submission %d: code %s, want %s", i+1, got.Code, rail.CodeUnavailable)
		}
	}
	if a := answerOf(t, do(s, "POST", rail.PathSubmit, okBody)); a.RailRef != "rail-000001" {
		t.Fatalf("third submission: %+v, want ACK rail-000001 (the failed ones were not recorded)", a)
	}
	if got := len(s.Submissions("")); got != 1 {
		t.Fatalf("got %d records, want 1", got)
	}
}

func TestHangFaultRecordsButWithholdsTheAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newStub(t, railstub.DefaultConfig())
		if rec := do(s, "POST", "/admin/faults", `{"failNext":1,"mode":"hang"}`); rec.Code != 200 {
			t.Fatalf("set faults: %d %s", rec.Code, rec.Body)
		}
		ctx, cancel := context.WithCancel(t.Context())
		req := postJSON(rail.PathSubmit, okBody).WithContext(ctx)
		rec := httptest.NewRecorder()
		done := make(chan struct{})
		go func() { s.ServeHTTP(rec, req); close(done) }()
		synctest.Wait() // the handler is now blocked, holding the answer
		select {
		case <-done:
			t.Fatal("the handler answered; a hang fault must hold the answer")
		default:
		}
		recs := s.Submissions("")
		if len(recs) != 1 || !recs[0].Withheld || recs[0].Answer.Status != rail.StatusAck {
			t.Fatalf("records %+v; want one withheld ACK: the money moved", recs)
		}
		cancel() // the caller gives up
		<-done
		if rec.Body.Len() != 0 {
			t.Fatalf("the caller got an answer %q", rec.Body)
		}
		// The fault is consumed: the next submission is answered.
		if a := answerOf(t, do(s, "POST", rail.PathSubmit, okBody)); a.RailRef != "rail-000002" {
			t.Fatalf("next answer %+v, want rail-000002", a)
		}
	})
}

func TestCloseReleasesAHeldSubmission(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newStub(t, railstub.DefaultConfig())
		do(s, "POST", "/admin/faults", `{"failNext":1,"mode":"hang"}`)
		rec := httptest.NewRecorder()
		done := make(chan struct{})
		go func() {
			s.ServeHTTP(rec, postJSON(rail.PathSubmit, okBody))
			close(done)
		}()
		synctest.Wait()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		<-done
		if rec.Code != http.StatusServiceUnavailable || envelopeOf(t, rec).Code != rail.CodeStubClosed {
			t.Fatalf("released answer %d %s; want 503 %s", rec.Code, rec.Body, rail.CodeStubClosed)
		}
		if got := do(s, "POST", rail.PathSubmit, okBody); got.Code != http.StatusServiceUnavailable {
			t.Fatalf("submission after Close: %d, want 503", got.Code)
		}
		if got := len(s.Submissions("")); got != 1 {
			t.Fatalf("got %d records, want 1 (the held one)", got)
		}
	})
}

func TestLatencyIsAddedAfterRecording(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := railstub.DefaultConfig()
		cfg.Latency = 3 * time.Second
		s := newStub(t, cfg)
		start := time.Now()
		answerOf(t, do(s, "POST", rail.PathSubmit, okBody))
		if got := time.Since(start); got != 3*time.Second {
			t.Fatalf("answer after %v, want 3s", got)
		}
		// Set at runtime; a caller that gives up during the latency has
		// still moved money.
		do(s, "POST", "/admin/faults", `{"latencyMs":60000}`)
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, postJSON(rail.PathSubmit, okBody).WithContext(ctx))
		if rec.Body.Len() != 0 {
			t.Fatalf("answered %q to a caller that gave up", rec.Body)
		}
		if got := len(s.Submissions("")); got != 2 {
			t.Fatalf("got %d records, want 2", got)
		}
	})
}

func TestRestartReloadsTheJournal(t *testing.T) {
	cfg := railstub.DefaultConfig()
	cfg.JournalPath = filepath.Join(t.TempDir(), "rail.jsonl")
	s := newStub(t, cfg)
	answerOf(t, do(s, "POST", rail.PathSubmit, okBody))
	answerOf(t, do(s, "POST", rail.PathSubmit, strings.ReplaceAll(okBody, "po-1", "po-2")))
	do(s, "POST", "/admin/faults", `{"failNext":1,"mode":"hang"}`)
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // a caller that is already gone: the hang returns at once
	s.ServeHTTP(httptest.NewRecorder(), postJSON(rail.PathSubmit, okBody).WithContext(ctx))
	before := s.Submissions("")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s2 := newStub(t, cfg)
	if after := s2.Submissions(""); !reflect.DeepEqual(after, before) {
		t.Fatalf("after restart:\n got %+v\nwant %+v", after, before)
	}
	if ref := answerOf(t, do(s2, "POST", rail.PathSubmit, okBody)).RailRef; ref != "rail-000004" {
		t.Fatalf("railRef after restart %s, want rail-000004", ref)
	}
	var list rail.SubmissionList
	if err := json.Unmarshal(do(s2, "GET", rail.PathJournal+"?payoutId=po-1", "").Body.Bytes(), &list); err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	for _, r := range list.Submissions {
		seqs = append(seqs, r.Seq)
	}
	if !reflect.DeepEqual(seqs, []int64{1, 3, 4}) {
		t.Fatalf("GET "+rail.PathJournal+"?payoutId=po-1 seqs %v, want [1 3 4]", seqs)
	}
}

func TestTornJournalTailIsCutOff(t *testing.T) {
	cfg := railstub.DefaultConfig()
	cfg.JournalPath = filepath.Join(t.TempDir(), "rail.jsonl")
	s := newStub(t, cfg)
	answerOf(t, do(s, "POST", rail.PathSubmit, okBody))
	_ = s.Close()
	f, err := os.OpenFile(cfg.JournalPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString(`{"seq":2,"receivedAt":"2026-`) // a crash mid-write
	_ = f.Close()

	s2 := newStub(t, cfg)
	if got := len(s2.Submissions("")); got != 1 {
		t.Fatalf("got %d records after a torn tail, want 1", got)
	}
	if ref := answerOf(t, do(s2, "POST", rail.PathSubmit, okBody)).RailRef; ref != "rail-000002" {
		t.Fatalf("railRef %s, want rail-000002", ref)
	}
	_ = s2.Close()
	s3 := newStub(t, cfg)
	if got := len(s3.Submissions("")); got != 2 {
		t.Fatalf("got %d records, want 2", got)
	}
}

func TestCorruptJournalRefusesToStart(t *testing.T) {
	for name, content := range map[string]string{
		"garbage line": "not json\n",
		"sequence gap": `{"seq":2,"receivedAt":"2026-01-01T00:00:00Z","request":{"payoutId":"p","accountId":"a","amountMinor":1,"currency":"EUR","reference":"p"},"answer":{"status":"ACK","railRef":"rail-000002"}}` + "\n",
	} {
		path := filepath.Join(t.TempDir(), "rail.jsonl")
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg := railstub.DefaultConfig()
		cfg.JournalPath = path
		if _, err := railstub.New(cfg, slog.New(slog.DiscardHandler)); !errors.Is(err, railstub.ErrJournal) {
			t.Errorf("%s: New error %v, want ErrJournal", name, err)
		}
	}
}

func TestLoadConfig(t *testing.T) {
	env := map[string]string{
		railstub.EnvDeclineOverMinor: "5000",
		railstub.EnvDeclineAccounts:  " acct-a, ,acct-b ",
		railstub.EnvLatencyMs:        "250",
		railstub.EnvJournal:          "/tmp/rail.jsonl",
	}
	got, err := railstub.LoadConfig(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	want := railstub.Config{DeclineOverMinor: 5000, DeclineAccounts: []string{"acct-a", "acct-b"}, Latency: 250 * time.Millisecond, JournalPath: "/tmp/rail.jsonl"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("LoadConfig = %+v, want %+v", got, want)
	}
	def, err := railstub.LoadConfig(func(string) string { return "" })
	if err != nil || !reflect.DeepEqual(def, railstub.DefaultConfig()) {
		t.Fatalf("LoadConfig(empty) = %+v, %v; want the defaults", def, err)
	}
	for k, v := range map[string]string{
		railstub.EnvDeclineOverMinor: "0",
		railstub.EnvLatencyMs:        "-1",
	} {
		if _, err := railstub.LoadConfig(func(kk string) string {
			if kk == k {
				return v
			}
			return ""
		}); !errors.Is(err, railstub.ErrInvalidConfig) {
			t.Errorf("%s=%s: error %v, want ErrInvalidConfig", k, v, err)
		}
	}
	for _, v := range []string{"x", "1.5"} {
		if _, err := railstub.LoadConfig(func(k string) string {
			if k == railstub.EnvDeclineOverMinor {
				return v
			}
			return ""
		}); !errors.Is(err, railstub.ErrInvalidConfig) {
			t.Errorf("%s=%s: error %v, want ErrInvalidConfig", railstub.EnvDeclineOverMinor, v, err)
		}
	}
}

// TestLoadConfigReportsEveryInvalidVariable: one run of LoadConfig names
// both variables to fix, not only the first.
func TestLoadConfigReportsEveryInvalidVariable(t *testing.T) {
	env := map[string]string{railstub.EnvDeclineOverMinor: "lots", railstub.EnvLatencyMs: "-5"}
	_, err := railstub.LoadConfig(func(k string) string { return env[k] })
	if !errors.Is(err, railstub.ErrInvalidConfig) {
		t.Fatalf("LoadConfig error = %v, want ErrInvalidConfig", err)
	}
	for _, name := range []string{railstub.EnvDeclineOverMinor, railstub.EnvLatencyMs} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("LoadConfig error %q does not name %s", err, name)
		}
	}
}

// TestEnvNamesListsEveryVariableLoadConfigReads keeps the list the unknown
// variable warning uses equal to what LoadConfig reads.
func TestEnvNamesListsEveryVariableLoadConfigReads(t *testing.T) {
	read := map[string]bool{}
	_, _ = railstub.LoadConfig(func(k string) string { read[k] = true; return "" })
	names := railstub.EnvNames()
	for k := range read {
		if !slices.Contains(names, k) {
			t.Errorf("LoadConfig reads %s, EnvNames does not list it", k)
		}
	}
	if len(names) != len(read) {
		t.Errorf("EnvNames = %v, LoadConfig reads %v", names, read)
	}
}

// A stop order answers the payments already made with the reference, and
// from then on a submission with it is refused and not recorded; the
// order survives a restart (it is in the journal). Stop orders are never
// listed as submissions.
func TestStopOrderRefusesLaterSubmissionsAcrossARestart(t *testing.T) {
	cfg := railstub.DefaultConfig()
	cfg.JournalPath = filepath.Join(t.TempDir(), "rail.jsonl")
	s := newStub(t, cfg)
	answerOf(t, do(s, "POST", rail.PathSubmit, okBody))

	stop := func(s *railstub.Stub, body string) rail.StopAnswer {
		t.Helper()
		rec := do(s, "POST", rail.PathStops, body)
		if rec.Code != http.StatusOK {
			t.Fatalf("POST "+rail.PathStops+" %s: %d %s", body, rec.Code, rec.Body)
		}
		var a rail.StopAnswer
		if err := json.Unmarshal(rec.Body.Bytes(), &a); err != nil {
			t.Fatal(err)
		}
		return a
	}
	if a := stop(s, `{"reference":"po-1"}`); len(a.Submissions) != 1 || a.Submissions[0].Request.PayoutID != "po-1" {
		t.Fatalf("stop of po-1 answered %+v; want its one payment", a)
	}
	if a := stop(s, `{"reference":"po-2"}`); a.Submissions == nil || len(a.Submissions) != 0 {
		t.Fatalf("stop of po-2 answered %+v; want an empty list", a)
	}
	late := strings.ReplaceAll(okBody, "po-1", "po-2")
	rec := do(s, "POST", rail.PathSubmit, late)
	if rec.Code != http.StatusConflict || envelopeOf(t, rec).Code != rail.CodeReferenceStopped {
		t.Fatalf("submission of a stopped reference: %d %s; want 409 %s", rec.Code, rec.Body, rail.CodeReferenceStopped)
	}
	if n := len(s.Submissions("")); n != 1 {
		t.Fatalf("%d submissions listed; want 1 (stop orders and refused submissions are not payments)", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s2 := newStub(t, cfg)
	if rec := do(s2, "POST", rail.PathSubmit, late); rec.Code != http.StatusConflict {
		t.Fatalf("after a restart, a submission of a stopped reference: %d %s; want 409", rec.Code, rec.Body)
	}
	if a := stop(s2, `{"reference":"po-2"}`); len(a.Submissions) != 0 {
		t.Fatalf("a second stop of po-2 answered %+v; want an empty list", a)
	}
	if n := len(s2.Submissions("")); n != 1 {
		t.Fatalf("after a restart, %d submissions listed; want 1", n)
	}
	for _, body := range []string{`{}`, `{"reference":""}`, `{"reference":"` + strings.Repeat("x", rail.MaxReferenceLen+1) + `"}`, `{"reference":"a","x":1}`} {
		if rec := do(s2, "POST", rail.PathStops, body); rec.Code != http.StatusBadRequest {
			t.Errorf("POST "+rail.PathStops+" %.40s: %d; want 400", body, rec.Code)
		}
	}
}

// postJSON is a POST of body as application/json, the rule of every
// service (jsonhandler.ContentType).
func postJSON(path, body string) *http.Request {
	r := httptest.NewRequest("POST", path, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	return r
}

// Newcomer probe, at rail-stub: a query parameter
// was ignored, so "POST /submit?dryRun=1" paid and "GET
// /submissions?payout=p" (misspelt) listed every payout's submissions as
// if they were p's. Now a parameter a route does not take is refused 400
// INVALID_REQUEST and nothing is recorded; GET /submissions?payoutId=P
// still filters.
func TestQueryParametersARouteDoesNotTakeAreRefused(t *testing.T) {
	s := newStub(t, railstub.DefaultConfig())
	for _, tc := range []struct{ name, method, path, body string }{
		{"submit", "POST", rail.PathSubmit + "?dryRun=1", okBody},
		{"submit, malformed query", "POST", rail.PathSubmit + "?a=%zz", okBody},
		{"stop order", "POST", rail.PathStops + "?force=1", `{"reference":"po-1"}`},
		{"faults", "POST", "/admin/faults?x=1", `{"latencyMs":5}`},
		{"submissions, misspelt filter", "GET", rail.PathJournal + "?payout=po-1", ``},
		{"submissions, filter given twice", "GET", rail.PathJournal + "?payoutId=a&payoutId=b", ``},
	} {
		rec := do(s, tc.method, tc.path, tc.body)
		if got := envelopeOf(t, rec); rec.Code != http.StatusBadRequest || got.Code != jsonhandler.CodeInvalidRequest || !strings.Contains(got.Message, "query") {
			t.Errorf("%s: %d %s; want 400 %s saying the query was refused", tc.name, rec.Code, rec.Body, jsonhandler.CodeInvalidRequest)
		}
	}
	if f := do(s, "GET", "/admin/faults", ""); !strings.Contains(f.Body.String(), `"latencyMs":0`) {
		t.Fatalf("refused fault settings changed the faults: %s", f.Body)
	}
	if ref := answerOf(t, do(s, "POST", rail.PathSubmit, okBody)).RailRef; ref != "rail-000001" {
		t.Fatalf("railRef %s, want rail-000001: a refused request was recorded (or stopped the reference)", ref)
	}
	rec := do(s, "GET", rail.PathJournal+"?payoutId=po-2", "")
	var list rail.SubmissionList
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &list) != nil || len(list.Submissions) != 0 {
		t.Fatalf("GET "+rail.PathJournal+"?payoutId=po-2: %d %s; want 200 and none", rec.Code, rec.Body)
	}
}
