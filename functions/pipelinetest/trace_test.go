package pipelinetest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/pipelinetest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/logjson"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
)

// spans is the SDK's in-memory exporter behind a synchronous processor,
// with a signal on every span ended so that a test can await a span
// instead of sleeping.
type spans struct {
	exp   *tracetest.InMemoryExporter
	ended chan struct{}
}

func (s *spans) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (s *spans) OnEnd(sdktrace.ReadOnlySpan) {
	select {
	case s.ended <- struct{}{}:
	default:
	}
}
func (s *spans) Shutdown(context.Context) error   { return nil }
func (s *spans) ForceFlush(context.Context) error { return nil }

// await returns the spans once done holds for them, or fails the test
// after 20 s with what was recorded.
func (s *spans) await(t *testing.T, what string, done func(tracetest.SpanStubs) bool) tracetest.SpanStubs {
	t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for {
		got := s.exp.GetSpans()
		if done(got) {
			return got
		}
		select {
		case <-s.ended:
		case <-deadline.C:
			t.Fatalf("%s: not recorded within 20 s; spans:\n%s", what, tree(got))
		}
	}
}

// installTracing makes the global tracer provider record every span in
// memory, with the project's propagator, until the test ends.
func installTracing(t *testing.T) *spans {
	t.Helper()
	s := &spans{exp: tracetest.NewInMemoryExporter(), ended: make(chan struct{}, 1)}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(s.exp), sdktrace.WithSpanProcessor(s))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(tracing.Propagator())
	t.Cleanup(func() {
		otel.SetTracerProvider(noop.NewTracerProvider())
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator())
		_ = tp.Shutdown(context.Background())
	})
	return s
}

// published is one message the outbox published.
type published struct {
	orderingKey string
	data        []byte
	attrs       map[string]string
}

// capture is a paymentresource.Publisher that hands every message to the
// test.
type capture chan published

func (c capture) Publish(ctx context.Context, orderingKey string, data []byte, attrs map[string]string) error {
	select {
	case c <- published{orderingKey, data, attrs}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// next returns the next message the outbox published, failing t after 20 s.
func (c capture) next(t *testing.T) published {
	t.Helper()
	select {
	case msg := <-c:
		return msg
	case <-time.After(20 * time.Second):
		t.Fatal("the outbox published nothing within 20 s")
		return published{}
	}
}

func attr(s tracetest.SpanStub, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

func attrString(s tracetest.SpanStub, key string) string {
	v, _ := attr(s, key)
	return v.String()
}

// serviceOf names the service that answered the server span s, by its
// port; "" for every other span.
func serviceOf(s tracetest.SpanStub, ports map[string]string) string {
	if s.SpanKind == trace.SpanKindServer {
		return ports[attrString(s, "server.port")]
	}
	return ""
}

// tree renders spans as an indented tree, for failure messages.
func tree(ss tracetest.SpanStubs) string {
	var b strings.Builder
	children := map[trace.SpanID][]tracetest.SpanStub{}
	ids := map[trace.SpanID]bool{}
	for _, s := range ss {
		ids[s.SpanContext.SpanID()] = true
	}
	var roots []tracetest.SpanStub
	for _, s := range ss {
		if p := s.Parent.SpanID(); s.Parent.IsValid() && ids[p] {
			children[p] = append(children[p], s)
		} else {
			roots = append(roots, s)
		}
	}
	var walk func(s tracetest.SpanStub, depth int)
	walk = func(s tracetest.SpanStub, depth int) {
		fmt.Fprintf(&b, "%s%s [%s] trace=%s parent=%s", strings.Repeat("  ", depth), s.Name, s.SpanKind, s.SpanContext.TraceID(), s.Parent.SpanID())
		for _, k := range []string{tracing.AttrFencePoint, tracing.AttrFenceStep, tracing.AttrToken, tracing.AttrFenceOutcome, "server.port", "url.path"} {
			if v, ok := attr(s, k); ok {
				fmt.Fprintf(&b, " %s=%s", k, v.String())
			}
		}
		b.WriteString("\n")
		for _, c := range children[s.SpanContext.SpanID()] {
			walk(c, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, 0)
	}
	return b.String()
}

func port(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Port()
}

// SC-12 by tooling: one payout, created at payment-resource,
// published by its outbox, pushed to the executor and executed through
// lock-server, payment-resource, rail-proxy and the rail, is ONE trace:
// every span recorded from the creation on shares its trace id and hangs
// off one root (the POST /v1/payouts request); the executor's delivery
// span is the child of the outbox's publish span, whose context travelled
// in the Pub/Sub message's attributes; and the grant's fencing token can
// be read as a span attribute at both fence points (payment-resource's
// claim and result, rail-proxy's submission) and at the lock store.
func TestOnePayoutIsOneTraceWithTheTokenAtBothFencePoints(t *testing.T) {
	rec := installTracing(t)
	msgs := make(capture, 4)
	var logs lockedBuffer
	p := pipelinetest.Start(t, pipelinetest.Options{Publisher: msgs, Log: logjson.New(&logs, slog.LevelDebug, false)})
	ev := payoutevent.Event{PayoutID: "p-trace", AccountID: "acct-trace", AmountMinor: 2500, Currency: "EUR"}
	opening := int64(1_000_000)
	if _, err := p.Pay.CreateAccount(t.Context(), api.AccountRequest{AccountID: ev.AccountID, Currency: ev.Currency, OpeningBalanceMinor: &opening}); err != nil {
		t.Fatal(err)
	}
	rec.exp.Reset() // the account's creation is a trace of its own
	if _, err := p.Pay.CreatePayout(t.Context(), api.PayoutRequest{PayoutID: ev.PayoutID, AccountID: ev.AccountID, AmountMinor: ev.AmountMinor, Currency: ev.Currency}); err != nil {
		t.Fatal(err)
	}
	msg := msgs.next(t)

	// The push, as Pub/Sub posts it, to the executor served as its main
	// serves it (the executor makes its own span from the message).
	// The lease's release follows the answer: its spans belong to the
	// trace too (pushPosted waits for it).
	pushPosted(t, newExecutor(t, p, "A", nil), msg)

	// Every hop closed: the delivery span ended, and each client span of
	// an HTTP call has its server span.
	got := rec.await(t, "the payout's spans", func(ss tracetest.SpanStubs) bool {
		servers := map[trace.SpanID]bool{}
		delivered := false
		for _, s := range ss {
			if s.SpanKind == trace.SpanKindServer {
				servers[s.Parent.SpanID()] = true
			}
			delivered = delivered || s.Name == executor.SpanDelivery
		}
		if !delivered {
			return false
		}
		for _, s := range ss {
			if s.SpanKind == trace.SpanKindClient && s.InstrumentationScope.Name == otelhttp.ScopeName && !servers[s.SpanContext.SpanID()] {
				return false
			}
		}
		return true
	})

	// One trace, one root, no orphan.
	ids := map[trace.SpanID]tracetest.SpanStub{}
	for _, s := range got {
		ids[s.SpanContext.SpanID()] = s
	}
	traceID := got[0].SpanContext.TraceID()
	var roots []string
	for _, s := range got {
		if s.SpanContext.TraceID() != traceID {
			t.Fatalf("span %q is in trace %s, not %s: the payout is more than one trace\n%s", s.Name, s.SpanContext.TraceID(), traceID, tree(got))
		}
		if _, ok := ids[s.Parent.SpanID()]; !ok {
			roots = append(roots, s.Name)
		}
	}
	if len(roots) != 1 {
		t.Fatalf("roots %q; want one, the payout's creation\n%s", roots, tree(got))
	}

	byName := func(name string) []tracetest.SpanStub {
		var out []tracetest.SpanStub
		for _, s := range got {
			if s.Name == name {
				out = append(out, s)
			}
		}
		return out
	}
	one := func(name string) tracetest.SpanStub {
		t.Helper()
		ss := byName(name)
		if len(ss) != 1 {
			t.Fatalf("%d spans %q; want 1\n%s", len(ss), name, tree(got))
		}
		return ss[0]
	}
	// The outbox publish span continues the creation, and the executor's
	// delivery continues the publish: the context crossed Pub/Sub in the
	// message's attributes.
	publish, delivery := one(paymentresource.SpanPublish), one(executor.SpanDelivery)
	if parent := ids[publish.Parent.SpanID()]; parent.SpanKind != trace.SpanKindServer || attrString(parent, "url.path") != api.PathPayouts {
		t.Errorf("the publish span's parent is %q %s; want the server span of POST %s\n%s", parent.Name, attrString(parent, "url.path"), api.PathPayouts, tree(got))
	}
	if delivery.Parent.SpanID() != publish.SpanContext.SpanID() {
		t.Errorf("the delivery span's parent is %q; want the outbox's publish span (traceparent in the message attributes)\n%s",
			ids[delivery.Parent.SpanID()].Name, tree(got))
	}

	// Every service answered inside the trace.
	ports := map[string]string{port(t, p.LockURL): "lock-server", port(t, p.PayURL): "payment-resource",
		port(t, p.ProxyURL): "rail-proxy", port(t, p.RailURL): "rail-stub"}
	seen := map[string]int{}
	for _, s := range got {
		if svc := serviceOf(s, ports); svc != "" {
			seen[svc]++
		}
	}
	for _, svc := range []string{"lock-server", "payment-resource", "rail-proxy", "rail-stub"} {
		if seen[svc] == 0 {
			t.Errorf("no server span of %s in the trace\n%s", svc, tree(got))
		}
	}

	// The grant's token, from the lock store's own record, at every point.
	state, err := p.Locks.Inspect(t.Context(), ev.LockKey())
	if err != nil {
		t.Fatal(err)
	}
	token := state.LastToken
	tokenOf := func(s tracetest.SpanStub) int64 {
		v, ok := attr(s, tracing.AttrToken)
		if !ok || v.Type() != attribute.INT64 {
			return 0
		}
		return v.AsInt64()
	}
	acquire := one("lockstore.Acquire")
	if tokenOf(acquire) != token || attrString(acquire, tracing.AttrLockKey) != ev.LockKey() {
		t.Errorf("lockstore.Acquire: token %d key %q; want %d %q", tokenOf(acquire), attrString(acquire, tracing.AttrLockKey), token, ev.LockKey())
	}
	if tokenOf(delivery) != token {
		t.Errorf("the delivery span's token is %d; want the grant's %d", tokenOf(delivery), token)
	}
	type fencePoint struct{ point, step string }
	want := []fencePoint{{paymentresource.FencePoint, paymentresource.StepClaim}, {railproxy.FencePoint, railproxy.StepSubmission},
		{paymentresource.FencePoint, paymentresource.StepResult}}
	var fences []fencePoint
	for _, s := range byName(fencing.SpanName) {
		fp := fencePoint{attrString(s, tracing.AttrFencePoint), attrString(s, tracing.AttrFenceStep)}
		fences = append(fences, fp)
		if tokenOf(s) != token || attrString(s, tracing.AttrFenceOutcome) != tracing.FenceAccepted {
			t.Errorf("fence span %s %s: token %d, outcome %q; want the grant's %d, %s\n%s", fp.point, fp.step, tokenOf(s),
				attrString(s, tracing.AttrFenceOutcome), token, tracing.FenceAccepted, tree(got))
		}
	}
	for _, w := range want {
		if !slices.Contains(fences, w) {
			t.Errorf("no fence span %s %s in the trace (got %v)\n%s", w.point, w.step, fences, tree(got))
		}
	}

	// The log lines the services wrote inside the payout's requests carry
	// the trace's id and the id of a span of it (internal/logjson): the
	// grant and the fence points' events name the trace their spans are in.
	linked := map[string]bool{}
	for _, line := range bytes.Split(logs.Bytes(), []byte("\n")) {
		var l map[string]any
		if json.Unmarshal(line, &l) != nil || (l["key"] != ev.LockKey() && l["payoutId"] != ev.PayoutID) {
			continue
		}
		event, _ := l["event"].(string)
		sid, _ := l[logjson.KeySpanID].(string)
		_, inTrace := ids[spanIDOf(sid)]
		if l[logjson.KeyTraceID] != traceID.String() || !inTrace {
			t.Errorf("log line %s: %s=%v %s=%v; want the payout's trace %s and one of its spans", event,
				logjson.KeyTraceID, l[logjson.KeyTraceID], logjson.KeySpanID, l[logjson.KeySpanID], traceID)
			continue
		}
		linked[event] = true
	}
	if !linked["lock_granted"] {
		t.Errorf("no lock_granted line linked to the trace (linked: %v)", linked)
	}
	if t.Failed() {
		return
	}
	t.Logf("one trace %s, %d spans, token %d at %v; log events linked to it: %v:\n%s", traceID, len(got), token, fences, slices.Sorted(maps.Keys(linked)), tree(got))
}

// spanIDOf parses a span id as logjson writes it (the zero id if it is not
// one).
func spanIDOf(s string) trace.SpanID {
	id, _ := trace.SpanIDFromHex(s)
	return id
}

// lockedBuffer is a bytes.Buffer that several services may log to at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.b.Bytes())
}

// jsonRaw is a body already encoded as JSON.
type jsonRaw []byte

func (j jsonRaw) MarshalJSON() ([]byte, error) { return j, nil }

// pushPosted pushes msg, as Pub/Sub posts it, to x served over HTTP, wants
// the payout posted, and closes x, which waits for the lease's release
// that follows the answer.
func pushPosted(t *testing.T, x *executor.Executor, msg published) {
	t.Helper()
	srv := httptest.NewServer(x)
	t.Cleanup(srv.Close)
	body, err := payoutevent.EncodeRaw(msg.data, msg.attrs, "m-1", msg.orderingKey, 1)
	if err != nil {
		t.Fatal(err)
	}
	st, answer := post(t, srv.URL, jsonRaw(body))
	if st != http.StatusOK || !strings.Contains(string(answer), string(executor.OutcomePosted)) {
		t.Fatalf("push answered %d %s; want 200 posted", st, answer)
	}
	if err := x.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
}
