package railstub

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
)

func TestJournalFailureRefusesLaterSubmissions(t *testing.T) {
	cfg := DefaultConfig()
	cfg.JournalPath = filepath.Join(t.TempDir(), "rail.jsonl")
	s, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_ = s.journal.f.Close() // every later write fails, like a full or failed disk
	body := `{"payoutId":"po-1","accountId":"acct-1","amountMinor":1,"currency":"EUR","reference":"po-1"}`
	for i := range 2 {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, postJSON(rail.PathSubmit, body))
		if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), rail.CodeJournalFailed) {
			t.Fatalf("submission %d: %d %s; want 500 %s", i+1, rec.Code, rec.Body, rail.CodeJournalFailed)
		}
		// The cause names the journal's path: the log has it, the answer
		// does not.
		if strings.Contains(rec.Body.String(), cfg.JournalPath) || strings.Contains(rec.Body.String(), "closed") {
			t.Fatalf("submission %d: answer %s carries internal text", i+1, rec.Body)
		}
	}
	if got := len(s.Submissions("")); got != 0 {
		t.Fatalf("got %d records, want 0: a submission not in the journal is not recorded", got)
	}
}

// postJSON is a POST of body as application/json, the rule of every
// service (jsonhandler.ContentType).
func postJSON(path, body string) *http.Request {
	r := httptest.NewRequest("POST", path, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	return r
}
