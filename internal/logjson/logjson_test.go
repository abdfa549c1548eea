package logjson

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
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

// TestLineInsideASpanCarriesItsIDs: with the SDK's in-memory exporter, a
// line logged with a span's context names the trace and span the exporter
// recorded; on Google Cloud with a project, Cloud Logging's trace field
// too; a line without a span carries none of them.
func TestLineInsideASpanCarriesItsIDs(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	for _, tc := range []struct {
		cloud   bool
		project string
		linked  bool // Cloud Logging's fields expected
	}{
		{false, "", false},
		{false, "lab-project", false}, // off Google Cloud the project is not used
		{true, "", false},
		{true, "lab-project", true},
	} {
		exp.Reset()
		var b bytes.Buffer
		log := NewInProject(&b, slog.LevelInfo, tc.cloud, tc.project).With("service", "test")
		ctx, span := tp.Tracer("logjson-test").Start(context.Background(), "request")
		log.InfoContext(ctx, "inside", "event", "inside_span")
		span.End()
		log.InfoContext(context.Background(), "outside", "event", "outside_span")
		lines := bytes.Split(bytes.TrimSpace(b.Bytes()), []byte("\n"))
		if len(lines) != 2 {
			t.Fatalf("%d lines: %s", len(lines), b.String())
		}
		var in, out map[string]any
		if err := json.Unmarshal(lines[0], &in); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(lines[1], &out); err != nil {
			t.Fatal(err)
		}
		spans := exp.GetSpans()
		if len(spans) != 1 {
			t.Fatalf("%d spans exported; want 1", len(spans))
		}
		sc := spans[0].SpanContext
		if in[KeyTraceID] != sc.TraceID().String() || in[KeySpanID] != sc.SpanID().String() {
			t.Errorf("cloud=%v project=%q: line %v; want %s=%s %s=%s (the exported span)", tc.cloud, tc.project, in, KeyTraceID, sc.TraceID(), KeySpanID, sc.SpanID())
		}
		wantTrace := "projects/lab-project/traces/" + sc.TraceID().String()
		if got, ok := in[KeyCloudTrace]; ok != tc.linked || (ok && got != wantTrace) {
			t.Errorf("cloud=%v project=%q: %s = %v (present %v); want present %v, %s", tc.cloud, tc.project, KeyCloudTrace, got, ok, tc.linked, wantTrace)
		}
		if tc.linked && (in[KeyCloudSpanID] != sc.SpanID().String() || in[KeyCloudSampled] != true) {
			t.Errorf("cloud=%v project=%q: line %v lacks Cloud Logging's span id or sampled flag", tc.cloud, tc.project, in)
		}
		for _, k := range []string{KeyTraceID, KeySpanID, KeyCloudTrace, KeyCloudSpanID, KeyCloudSampled} {
			if _, ok := out[k]; ok {
				t.Errorf("a line outside any span carries %s: %v", k, out)
			}
		}
	}
}

func TestProject(t *testing.T) {
	if got := Project(func(k string) string { return map[string]string{EnvProject: "p-1"}[k] }); got != "p-1" {
		t.Errorf("Project = %q; want p-1", got)
	}
}
