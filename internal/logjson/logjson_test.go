package logjson

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"
)

func TestCloudLoggingKeys(t *testing.T) {
	for _, tc := range []struct {
		cloud            bool
		levelKey, msgKey string
		warn             string
	}{
		{false, "level", "msg", "WARN"},
		{true, "severity", "message", "WARNING"},
	} {
		var b bytes.Buffer
		log := New(&b, slog.LevelDebug, tc.cloud)
		log.Warn("lease lost", "event", "lease_lost", slog.Group("g", "msg", "kept"))
		var line map[string]any
		if err := json.Unmarshal(b.Bytes(), &line); err != nil {
			t.Fatal(err)
		}
		if line[tc.levelKey] != tc.warn || line[tc.msgKey] != "lease lost" || line["event"] != "lease_lost" {
			t.Errorf("cloud=%v: %v; want %s=%s and %s=lease lost", tc.cloud, line, tc.levelKey, tc.warn, tc.msgKey)
		}
		if g, _ := line["g"].(map[string]any); g["msg"] != "kept" {
			t.Errorf("cloud=%v: a group's attribute was renamed: %v", tc.cloud, line)
		}
	}
	for l, want := range map[slog.Level]string{slog.LevelDebug: "DEBUG", slog.LevelInfo: "INFO", slog.LevelWarn: "WARNING", slog.LevelError: "ERROR", slog.LevelError + 4: "ERROR"} {
		if got := severity(l); got != want {
			t.Errorf("severity(%v) = %s; want %s", l, got, want)
		}
	}
}

func TestOnGoogleCloud(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	if OnGoogleCloud(env(nil)) || !OnGoogleCloud(env(map[string]string{EnvCloudRun: "rail-proxy"})) || !OnGoogleCloud(env(map[string]string{EnvKubernetes: "10.0.0.1"})) {
		t.Error("OnGoogleCloud does not follow K_SERVICE and KUBERNETES_SERVICE_HOST")
	}
}
