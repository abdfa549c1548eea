package payoutbus

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
)

// TestAFailedPushLogsWhatTheEndpointAnswered: the push_delivered line of a
// push the endpoint refused carries the status, and the error envelope's
// code and message in code and error (it used to log error "" for every
// answer, so a 503 said nothing of why); a body that is not the envelope
// is quoted; an accepted push logs no error, at DEBUG (the executor's own
// line tells its outcome), a failed one at INFO.
func TestAFailedPushLogsWhatTheEndpointAnswered(t *testing.T) {
	const msg = "the rail was not reached; nothing was recorded"
	for _, tc := range []struct {
		name    string
		answer  func(w http.ResponseWriter)
		ok      bool
		level   string
		status  int
		code    string
		errWant []string // substrings of the line's error; nil: error ""
	}{
		{"envelope", func(w http.ResponseWriter) {
			jsonhandler.WriteError(w, http.StatusServiceUnavailable, string(railapi.CodeRailNotReached), msg, true)
		}, false, "INFO", http.StatusServiceUnavailable, string(railapi.CodeRailNotReached),
			[]string{"503", string(railapi.CodeRailNotReached), msg}},
		{"not the envelope", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusBadGateway)
			_, _ = w.Write([]byte("<html>upstream connect error</html>\n"))
		}, false, "INFO", http.StatusBadGateway, "", []string{"502", "upstream connect error"}},
		{"empty", func(w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) },
			false, "INFO", http.StatusServiceUnavailable, "", []string{"503", "no body"}},
		{"accepted", func(w http.ResponseWriter) { w.WriteHeader(http.StatusNoContent) },
			true, "DEBUG", http.StatusNoContent, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { tc.answer(w) }))
			defer endpoint.Close()
			var logBuf bytes.Buffer
			b := &PushBridge{Endpoint: endpoint.URL, Log: slog.New(slog.NewJSONHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelDebug}))}
			if got := b.deliver(t.Context(), endpoint.Client(), "m-1", []byte(`{}`), 1, false); got != tc.ok {
				t.Errorf("deliver = %v; want %v", got, tc.ok)
			}
			var line struct {
				Level  string `json:"level"`
				Event  string `json:"event"`
				Status int    `json:"status"`
				Code   string `json:"code"`
				Error  string `json:"error"`
			}
			if err := json.Unmarshal(logBuf.Bytes(), &line); err != nil {
				t.Fatalf("log line: %v: %s", err, logBuf.Bytes())
			}
			if line.Event != EventPushDelivered || line.Status != tc.status || line.Code != tc.code {
				t.Errorf("event %q status %d code %q; want %q %d %q", line.Event, line.Status, line.Code, EventPushDelivered, tc.status, tc.code)
			}
			if line.Level != tc.level {
				t.Errorf("level %s; want %s", line.Level, tc.level)
			}
			if tc.errWant == nil && line.Error != "" {
				t.Errorf("error %q; want none", line.Error)
			}
			if tc.errWant != nil && line.Error == "" {
				t.Errorf("error is empty; want it to name %q", tc.errWant)
			}
			for _, w := range tc.errWant {
				if !strings.Contains(line.Error, w) {
					t.Errorf("error %q does not name %q", line.Error, w)
				}
			}
		})
	}
}
