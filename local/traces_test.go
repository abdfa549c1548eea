package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

// TestTraceSinkWritesEachSpanAsALine: a span exported over OTLP/HTTP, as
// every process of the stack exports them, arrives in the file as one
// line with the service, the hex trace id of the log lines, and its
// attributes (the token a number).
func TestTraceSinkWritesEachSpanAsALine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spans.jsonl")
	sink, endpoint, err := startTraceSink(path)
	if err != nil {
		t.Fatal(err)
	}
	exp, err := otlptracehttp.New(t.Context(), otlptracehttp.WithEndpointURL(endpoint+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp),
		sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName("rail-proxy"))))
	_, sp := tp.Tracer("test").Start(t.Context(), "POST /v1/rail/submissions")
	sp.SetAttributes(attribute.Int64("fencing.token", 1796500252155200))
	sp.End()
	if err := tp.Shutdown(t.Context()); err != nil { // flushes the export
		t.Fatal(err)
	}
	if err := sink.Close(t.Context()); err != nil {
		t.Fatal(err)
	}

	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		got = append(got, m)
	}
	if len(got) != 1 {
		t.Fatalf("%d lines %v; want one span", len(got), got)
	}
	l, attrs := got[0], got[0]["attributes"].(map[string]any)
	if l["service"] != "rail-proxy" || l["name"] != "POST /v1/rail/submissions" || l["traceId"] != sp.SpanContext().TraceID().String() ||
		l["spanId"] != sp.SpanContext().SpanID().String() || attrs["fencing.token"] != float64(1796500252155200) {
		t.Errorf("span line %v; want service rail-proxy, the span's name, trace id %s, span id %s, fencing.token 1796500252155200",
			l, sp.SpanContext().TraceID(), sp.SpanContext().SpanID())
	}
}
