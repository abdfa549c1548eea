package fencing_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
)

// A fence span carries the presented token and the verdict: accepted, a
// refusal with the refusing resource and its high-water mark (found in a
// wrapped error), unverified, or error; only the last records the error,
// and none sets an error status (a refusal is the fence working).
func TestFenceSpanRecordsTheTokenAndTheVerdict(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)))
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })

	sentinel := errors.New("point: fenced out")
	refusal := fencing.Refusal{Resource: "rail", ResourceID: "acct-1", PresentedToken: 3, HighestToken: 7}
	for _, tc := range []struct {
		name    string
		err     error
		outcome string
		highest int64
		events  int
	}{
		{"accepted", nil, tracing.FenceAccepted, 0, 0},
		{"refused", fmt.Errorf("%w: %w", sentinel, refusal), tracing.FenceRefused, 7, 0},
		{"unverified", fmt.Errorf("point: not verified: %w", fencing.ErrUnverified), tracing.FenceUnverified, 0, 0},
		{"error", errors.New("database down"), tracing.FenceError, 0, 1},
	} {
		exp.Reset()
		_, span := fencing.StartSpan(context.Background(), "rail-proxy", "submission", 3, true)
		fencing.EndSpan(span, tc.err)
		got := exp.GetSpans()
		if len(got) != 1 {
			t.Fatalf("%s: %d spans; want 1", tc.name, len(got))
		}
		attrs := map[string]any{}
		for _, kv := range got[0].Attributes {
			attrs[string(kv.Key)] = kv.Value.AsInterface()
		}
		highest, _ := attrs[tracing.AttrHighestToken].(int64)
		if attrs[tracing.AttrToken] != int64(3) || attrs[tracing.AttrFenceOutcome] != tc.outcome || highest != tc.highest {
			t.Errorf("%s: attributes %v; want token 3, outcome %s, highest %d", tc.name, attrs, tc.outcome, tc.highest)
		}
		if len(got[0].Events) != tc.events || got[0].Status.Code != 0 {
			t.Errorf("%s: %d events, status %v; want %d events and no status", tc.name, len(got[0].Events), got[0].Status, tc.events)
		}
	}
}
