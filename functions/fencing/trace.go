package fencing

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
)

// tracerName scopes the fence points' spans.
const tracerName = "github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"

// SpanName is the name of the span of one fenced write at a fence point.
const SpanName = "fence"

// StartSpan starts the span of one fenced write at a fence point, child of
// the span of ctx (the request's server span): point names the fence point
// (tracing.AttrFencePoint: "payment-resource", "rail-proxy"), step the
// write (tracing.AttrFenceStep), token the holder's fencing token
// (tracing.AttrToken: the number the fence point compares, so that one
// grant's token can be followed through every fence of a trace), enabled
// the fence point's kill switch; attrs add ids (payout, account). End it
// with EndSpan.
func StartSpan(ctx context.Context, point, step string, token int64, enabled bool, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return tracing.Tracer(tracerName).Start(ctx, SpanName, trace.WithAttributes(append(attrs,
		attribute.String(tracing.AttrFencePoint, point),
		attribute.String(tracing.AttrFenceStep, step),
		attribute.Int64(tracing.AttrToken, token),
		attribute.Bool(tracing.AttrFencingEnabled, enabled),
	)...))
}

// EndSpan records the verdict of the fenced write on span and ends it:
// tracing.FenceAccepted for a nil err; tracing.FenceRefused when err
// wraps a Refusal (errors.As), with the refusing resource and its
// HighestToken; tracing.FenceUnverified when err wraps ErrUnverified;
// tracing.FenceError otherwise (another refusal, such as a finished
// payout, or a database failure), with err recorded as the span's
// exception event. The span's status is left unset: a refusal is the
// fence working, and the request's server span carries the HTTP status.
func EndSpan(span trace.Span, err error) {
	var r Refusal
	switch {
	case err == nil:
		span.SetAttributes(attribute.String(tracing.AttrFenceOutcome, tracing.FenceAccepted))
	case errors.As(err, &r):
		span.SetAttributes(
			attribute.String(tracing.AttrFenceOutcome, tracing.FenceRefused),
			attribute.String(tracing.AttrFenceResource, r.Resource),
			attribute.Int64(tracing.AttrHighestToken, r.HighestToken),
		)
	case errors.Is(err, ErrUnverified):
		span.SetAttributes(attribute.String(tracing.AttrFenceOutcome, tracing.FenceUnverified))
	default:
		span.SetAttributes(attribute.String(tracing.AttrFenceOutcome, tracing.FenceError))
		span.RecordError(err)
	}
	span.End()
}
