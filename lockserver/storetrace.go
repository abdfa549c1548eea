package lockserver

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// tracerName scopes the spans of TraceStore.
const tracerName = "github.com/distributed-lock-lab/distributed-lock-lab/lockserver"

// TraceStore returns s with a span around every call (lockstore.Acquire,
// lockstore.Renew, ...), child of the span in the call's context (the
// request's server span), from the global tracer provider. NewServer
// applies it to its store, outermost, so every lock-server traces its
// store calls. Each span carries backend (tracing.AttrLockStore; NewServer
// gives the backend's Go type: *pgstore.Store, *etcdstore.Store,
// *memstore.Store), the lock key, the owner, the fencing token (the one granted by
// Acquire, the one presented to Renew, Release and Revoke, the last one
// Inspect reports) and the outcome (tracing.AttrLockOutcome: ok, or the
// sentinel that refused); a backend failure also sets the span's status
// to error. Ping is not traced (readiness probes). Close closes s.
func TraceStore(s store.LockStore, backend string) store.LockStore {
	return &tracedStore{s: s, backend: backend, tr: tracing.Tracer(tracerName)}
}

type tracedStore struct {
	s       store.LockStore
	backend string
	tr      trace.Tracer
}

var _ store.LockStore = (*tracedStore)(nil)

func (t *tracedStore) start(ctx context.Context, op, key string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return t.tr.Start(ctx, "lockstore."+op, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(append(attrs, attribute.String(tracing.AttrLockStore, t.backend), attribute.String(tracing.AttrLockKey, key))...))
}

// end records err's outcome on span and ends it.
func end(span trace.Span, err error) {
	outcome := lockOutcome(err)
	span.SetAttributes(attribute.String(tracing.AttrLockOutcome, outcome))
	if outcome == "unavailable" || outcome == "error" || outcome == "restored" {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// lockOutcome names err for tracing.AttrLockOutcome.
func lockOutcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, store.ErrLockHeld):
		return "held"
	case errors.Is(err, store.ErrStaleToken):
		return "stale_token"
	case errors.Is(err, store.ErrNotHeld):
		return "not_held"
	case errors.Is(err, store.ErrInvalidArgument):
		return "invalid"
	case errors.Is(err, store.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, store.ErrBackendRestored):
		return "restored"
	}
	return "error"
}

func (t *tracedStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (store.Lease, error) {
	ctx, span := t.start(ctx, "Acquire", key, attribute.String(tracing.AttrLockOwner, owner), attribute.Int64(tracing.AttrLeaseTTLMs, ttl.Milliseconds()))
	l, err := t.s.Acquire(ctx, key, owner, ttl)
	if err == nil {
		span.SetAttributes(attribute.Int64(tracing.AttrToken, l.Token))
	}
	end(span, err)
	return l, err
}

func (t *tracedStore) Renew(ctx context.Context, key, owner string, token int64) (store.Lease, error) {
	ctx, span := t.start(ctx, "Renew", key, attribute.String(tracing.AttrLockOwner, owner), attribute.Int64(tracing.AttrToken, token))
	l, err := t.s.Renew(ctx, key, owner, token)
	end(span, err)
	return l, err
}

func (t *tracedStore) Release(ctx context.Context, key, owner string, token int64) error {
	ctx, span := t.start(ctx, "Release", key, attribute.String(tracing.AttrLockOwner, owner), attribute.Int64(tracing.AttrToken, token))
	err := t.s.Release(ctx, key, owner, token)
	end(span, err)
	return err
}

func (t *tracedStore) Revoke(ctx context.Context, key string, token int64) (store.Lease, error) {
	ctx, span := t.start(ctx, "Revoke", key, attribute.Int64(tracing.AttrToken, token))
	l, err := t.s.Revoke(ctx, key, token)
	if err == nil && token == 0 {
		span.SetAttributes(attribute.Int64(tracing.AttrToken, l.Token))
	}
	end(span, err)
	return l, err
}

func (t *tracedStore) Inspect(ctx context.Context, key string) (store.State, error) {
	ctx, span := t.start(ctx, "Inspect", key)
	st, err := t.s.Inspect(ctx, key)
	if err == nil {
		span.SetAttributes(attribute.Int64(tracing.AttrToken, st.LastToken))
	}
	end(span, err)
	return st, err
}

func (t *tracedStore) Ping(ctx context.Context) error { return t.s.Ping(ctx) }

func (t *tracedStore) Close() error { return t.s.Close() }

// TraceHandoff returns h with a span lockstore.Handoff around every call,
// as TraceStore traces the LockStore methods: backend, the key, the new
// owner and its TTL, the fencing token (from's when the span starts,
// replaced by the granted one on success) and the outcome. NewServer
// applies it to its store's Handoffer (the Batcher and TraceStore's
// wrapper hide the capability; see Handoffer).
func TraceHandoff(h store.Handoffer, backend string) store.Handoffer {
	return &tracedHandoffer{h: h, t: &tracedStore{backend: backend, tr: tracing.Tracer(tracerName)}}
}

type tracedHandoffer struct {
	h store.Handoffer
	t *tracedStore
}

func (t *tracedHandoffer) Handoff(ctx context.Context, from store.LeaseRef, to store.AcquireRequest) (store.Lease, error) {
	ctx, span := t.t.start(ctx, "Handoff", from.Key, attribute.String(tracing.AttrLockOwner, to.Owner),
		attribute.Int64(tracing.AttrLeaseTTLMs, to.TTL.Milliseconds()), attribute.Int64(tracing.AttrToken, from.Token))
	l, err := t.h.Handoff(ctx, from, to)
	if err == nil {
		span.SetAttributes(attribute.Int64(tracing.AttrToken, l.Token))
	}
	end(span, err)
	return l, err
}
