package envcheck

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"testing"
)

func TestFindReturnsPrefixedVariablesNotRead(t *testing.T) {
	known := []string{"LOCK_STORE", "LOCKDB_URL", "RAIL_PROXY_FENCING_ENABLED"}
	environ := []string{
		"PATH=/usr/bin", "HOME=/root", // no project prefix
		"LOCK_STORE=etcd", "LOCKDB_URL=postgres://x", // read
		"LOCK_TTL=5000",                       // prefixed, not read, nothing close
		"RAIL_PROXY_FENCING_ENABLE=false",     // near miss
		"RAIL_PROXY_FENCING_ENABLE=true",      // duplicate entry: reported once
		"PUBSUB_EMULATOR_HOST=127.0.0.1:8085", // not a project prefix
		"LOG_LEVEL=debug",
	}
	got := Find(known, environ)
	want := []Unknown{
		{Name: "LOCK_TTL"},
		{Name: "RAIL_PROXY_FENCING_ENABLE", Suggestion: "RAIL_PROXY_FENCING_ENABLED"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Find = %+v, want %+v", got, want)
	}
}

func TestFindSuggestsTheClosestKnownName(t *testing.T) {
	known := []string{"LEASE_TTL_MS", "ACQUIRE_WAIT_MS", "LOCK_REQUEST_TIMEOUT_MS"}
	for _, tc := range []struct{ name, want string }{
		{"LEASE_TTL", "LEASE_TTL_MS"},                         // missing unit
		{"ACQIURE_WAIT_MS", ""},                               // not a prefix of ours: not reported at all
		{"LOCK_REQEST_TIMEOUT_MS", "LOCK_REQUEST_TIMEOUT_MS"}, // dropped letter
		{"LOCK_SHUTDOWN_TIMEOUT_MS", ""},                      // far from every known name
	} {
		got := Find(known, []string{tc.name + "=1"})
		if tc.name == "ACQIURE_WAIT_MS" {
			if len(got) != 0 {
				t.Errorf("Find(%s) = %+v, want nothing (prefix ACQIURE_ is not the project's)", tc.name, got)
			}
			continue
		}
		if len(got) != 1 || got[0].Suggestion != tc.want {
			t.Errorf("Find(%s) = %+v, want one entry suggesting %q", tc.name, got, tc.want)
		}
	}
}

func TestDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{{"", "", 0}, {"ABC", "", 3}, {"KITTEN", "SITTING", 3}, {"LOCK_TTL", "LOCK_TTL", 0}, {"AB", "BA", 2}} {
		if got := distance(tc.a, tc.b); got != tc.want {
			t.Errorf("distance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestWarnLogsOneLinePerUnknownVariable(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	Warn(log, []string{"ETCD_IDLE_LEASES"}, []string{"ETCD_IDLE_LEASE=0", "ETCD_FOO=1", "ETCD_IDLE_LEASES=3"})
	var lines []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want 2: %s", len(lines), buf.String())
	}
	for i, want := range []struct{ variable, suggestion string }{{"ETCD_FOO", ""}, {"ETCD_IDLE_LEASE", "ETCD_IDLE_LEASES"}} {
		l := lines[i]
		if l["level"] != "WARN" || l["event"] != EventUnknownVariable || l["variable"] != want.variable {
			t.Errorf("line %d = %v, want WARN %s variable %s", i, l, EventUnknownVariable, want.variable)
		}
		if got, _ := l["didYouMean"].(string); got != want.suggestion {
			t.Errorf("line %d didYouMean = %q, want %q", i, got, want.suggestion)
		}
	}
}

func TestHTTPURL(t *testing.T) {
	for _, ok := range []string{"http://127.0.0.1:8080", "https://pay-abc.a.run.app/"} {
		if err := HTTPURL("X_URL", ok); err != nil {
			t.Errorf("HTTPURL(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "127.0.0.1:8080", "ftp://x", "http://", "http://%zz"} {
		if err := HTTPURL("X_URL", bad); err == nil || !strings.Contains(err.Error(), "X_URL") {
			t.Errorf("HTTPURL(%q) = %v; want an error naming X_URL", bad, err)
		}
	}
}
