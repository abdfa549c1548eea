package paymentresource_test

import (
	"net/http"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
)

// Each fenced write is a fence span with the presented token; a stale
// claim's span says refused, by which row, and the token that row holds
// (the error that refuses it carries the fencing.Refusal). Not parallel:
// the tracer provider is the process's.
func TestFenceSpansShowTheTokenAndTheRefusal(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)))
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 1_000_000)
	f.createPayout("p-1", "acct-1", 100, "EUR")
	st, body := f.claim("p-1", 5, "new")
	want(t, "claim with 5", st, body, http.StatusOK, "")
	st, body = f.claim("p-1", 3, "stale")
	want(t, "claim with 3", st, body, http.StatusConflict, api.CodeFencedOut)

	type fence struct {
		step, outcome, resource string
		token, highest          int64
	}
	var got []fence
	for _, s := range exp.GetSpans() {
		if s.Name != fencing.SpanName {
			continue
		}
		a := map[string]any{}
		for _, kv := range s.Attributes {
			a[string(kv.Key)] = kv.Value.AsInterface()
		}
		if a[tracing.AttrFencePoint] != paymentresource.FencePoint {
			t.Errorf("fence span of %v; want %s", a[tracing.AttrFencePoint], paymentresource.FencePoint)
		}
		fe := fence{step: a[tracing.AttrFenceStep].(string), outcome: a[tracing.AttrFenceOutcome].(string), token: a[tracing.AttrToken].(int64)}
		fe.resource, _ = a[tracing.AttrFenceResource].(string)
		fe.highest, _ = a[tracing.AttrHighestToken].(int64)
		got = append(got, fe)
	}
	wantSpans := []fence{
		{paymentresource.StepClaim, tracing.FenceAccepted, "", 5, 0},
		{paymentresource.StepClaim, tracing.FenceRefused, "payout", 3, 5},
	}
	if len(got) != len(wantSpans) || got[0] != wantSpans[0] || got[1] != wantSpans[1] {
		t.Fatalf("fence spans %+v; want %+v", got, wantSpans)
	}
}
