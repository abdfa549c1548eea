package lockserver_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// Every store operation is a span carrying the lock key and the token
// (granted by Acquire, presented to Renew and Release), with the store's
// verdict; a refusal is an outcome, not an error status.
func TestTraceStoreSpansCarryTheKeyAndTheToken(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })

	s := lockserver.TraceStore(memstore.New(nil), "memory")
	ctx := context.Background()
	l, err := s.Acquire(ctx, "payout:acct-1", "A", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, "payout:acct-1", "B", time.Minute); !errors.Is(err, store.ErrLockHeld) {
		t.Fatalf("second acquire: %v; want ErrLockHeld", err)
	}
	if _, err := s.Renew(ctx, "payout:acct-1", "A", l.Token); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, "payout:acct-1", "A", l.Token); err != nil {
		t.Fatal(err)
	}
	type want struct {
		name, outcome string
		token         int64
	}
	wants := []want{{"lockstore.Acquire", "ok", l.Token}, {"lockstore.Acquire", "held", 0}, {"lockstore.Renew", "ok", l.Token}, {"lockstore.Release", "ok", l.Token}}
	got := exp.GetSpans()
	if len(got) != len(wants) {
		t.Fatalf("%d spans; want %d", len(got), len(wants))
	}
	for i, w := range wants {
		s := got[i]
		attrs := map[string]any{}
		for _, kv := range s.Attributes {
			attrs[string(kv.Key)] = kv.Value.AsInterface()
		}
		token, _ := attrs[tracing.AttrToken].(int64)
		if s.Name != w.name || attrs[tracing.AttrLockOutcome] != w.outcome || token != w.token ||
			attrs[tracing.AttrLockKey] != "payout:acct-1" || attrs[tracing.AttrLockStore] != "memory" {
			t.Errorf("span %d: %s %v; want %s outcome %s token %d key payout:acct-1 store memory", i, s.Name, attrs, w.name, w.outcome, w.token)
		}
		if s.Status.Code != 0 {
			t.Errorf("span %d (%s) has status %v; a refusal is not an error", i, s.Name, s.Status)
		}
	}
}

// TraceHandoff gives a handoff a span of its own, carrying the new grant's
// token (or, refused, the presented one) and the verdict.
func TestTraceHandoffSpansCarryTheNewToken(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })

	mem := memstore.New(nil)
	h := lockserver.TraceHandoff(mem, "memory")
	ctx := context.Background()
	l, err := mem.Acquire(ctx, "payout:acct-1", "A", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	from := store.LeaseRef{Key: "payout:acct-1", Owner: "A", Token: l.Token}
	to := store.AcquireRequest{Key: "payout:acct-1", Owner: "B", TTL: time.Minute}
	n, err := h.Handoff(ctx, from, to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Handoff(ctx, from, to); !errors.Is(err, store.ErrStaleToken) {
		t.Fatalf("second handoff: %v; want ErrStaleToken", err)
	}
	got := exp.GetSpans()
	if len(got) != 2 {
		t.Fatalf("%d spans; want 2", len(got))
	}
	for i, w := range []struct {
		outcome string
		token   int64
	}{{"ok", n.Token}, {"stale_token", l.Token}} {
		attrs := map[string]any{}
		for _, kv := range got[i].Attributes {
			attrs[string(kv.Key)] = kv.Value.AsInterface()
		}
		if got[i].Name != "lockstore.Handoff" || attrs[tracing.AttrLockOutcome] != w.outcome || attrs[tracing.AttrToken] != w.token ||
			attrs[tracing.AttrLockOwner] != "B" || attrs[tracing.AttrLockStore] != "memory" {
			t.Errorf("span %d: %s %v; want lockstore.Handoff outcome %s token %d owner B", i, got[i].Name, attrs, w.outcome, w.token)
		}
	}
}
