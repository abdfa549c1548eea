package executor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
)

// The delivery span continues the trace whose context the message's
// attributes carry (the outbox's publish span), not the push request's
// headers (Pub/Sub's or Cloud Run's), which become a link; it carries the
// lease's token and the outcome, and the calls made under it carry it on.
func TestDeliverySpanContinuesTheMessageTrace(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(tracing.Propagator())
	t.Cleanup(func() {
		otel.SetTracerProvider(noop.NewTracerProvider())
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator())
	})
	deps := &fakeDeps{railStatus: 200, railBody: `{"status":"ACK","railRef":"rail-000001"}`}
	x, store := newExecutor(t, deps, nil)

	publish := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{0xa}, SpanID: trace.SpanID{0xb}, TraceFlags: trace.FlagsSampled})
	pubsub := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{0xc}, SpanID: trace.SpanID{0xd}, TraceFlags: trace.FlagsSampled})
	attrs := map[string]string{payoutevent.AttrPayoutID: event.PayoutID, payoutevent.AttrAccountID: event.AccountID}
	tracing.Inject(trace.ContextWithSpanContext(context.Background(), publish), attrs)
	data, err := json.Marshal(event)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := payoutevent.EncodeRaw(data, attrs, "m-1", "acct-7", 1)
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest("POST", "/", bytes.NewReader(raw))
	tracing.Propagator().Inject(trace.ContextWithSpanContext(context.Background(), pubsub), propagation.HeaderCarrier(req.Header))
	rec := httptest.NewRecorder()
	x.ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Fatalf("push answered %d %s; want 200", rec.Code, rec.Body)
	}
	if err := x.Close(t.Context()); err != nil { // the release, sent after the answer
		t.Fatal(err)
	}

	var delivery tracetest.SpanStub
	n := 0
	for _, s := range exp.GetSpans() {
		if s.Name == executor.SpanDelivery {
			delivery, n = s, n+1
		}
	}
	if n != 1 {
		t.Fatalf("%d delivery spans; want 1", n)
	}
	if delivery.Parent.SpanID() != publish.SpanID() || delivery.SpanContext.TraceID() != publish.TraceID() {
		t.Errorf("delivery span: trace %s parent %s; want the message's %s %s", delivery.SpanContext.TraceID(), delivery.Parent.SpanID(), publish.TraceID(), publish.SpanID())
	}
	if len(delivery.Links) != 1 || delivery.Links[0].SpanContext.SpanID() != pubsub.SpanID() {
		t.Errorf("delivery span links %v; want one, the push request's %s", delivery.Links, pubsub.SpanID())
	}
	st, _ := store.Inspect(context.Background(), "payout:acct-7")
	got := map[string]any{}
	for _, kv := range delivery.Attributes {
		got[string(kv.Key)] = kv.Value.AsInterface()
	}
	if got[tracing.AttrToken] != st.LastToken || got[tracing.AttrOutcome] != string(executor.OutcomePosted) || got[tracing.AttrLockKey] != "payout:acct-7" {
		t.Errorf("delivery span attributes %v; want token %d, outcome posted, lock payout:acct-7", got, st.LastToken)
	}
	// Every call under the delivery is its child (the default client is
	// traced), so the services' spans join the message's trace.
	// (The fake lock-server here is not served through tracing.Handler, so
	// its own store spans start traces of their own: only the executor's
	// HTTP client spans are checked.)
	clients := 0
	for _, s := range exp.GetSpans() {
		if s.InstrumentationScope.Name != otelhttp.ScopeName || s.SpanKind != trace.SpanKindClient {
			continue
		}
		clients++
		if s.SpanContext.TraceID() != publish.TraceID() || s.Parent.SpanID() != delivery.SpanContext.SpanID() {
			t.Errorf("client span %q in trace %s under %s; want the message's trace %s, under the delivery span", s.Name,
				s.SpanContext.TraceID(), s.Parent.SpanID(), publish.TraceID())
		}
	}
	if clients == 0 {
		t.Errorf("no client span: the executor's calls carry no trace context")
	}
}
