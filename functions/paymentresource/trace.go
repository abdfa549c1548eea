package paymentresource

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
)

// tracerName scopes payment-resource's own spans.
const tracerName = "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource"

// FencePoint is payment-resource's name as a fence point, the value of
// tracing.AttrFencePoint on its fence spans.
const FencePoint = "payment-resource"

// Steps of payment-resource's fenced writes, values of
// tracing.AttrFenceStep.
const (
	StepClaim      = "claim"
	StepResult     = "result"
	StepAttention  = "attention"
	StepResolution = "resolution"
)

// fenced runs one fenced write of holder h on payout id inside its fence
// span (fencing.StartSpan): the token the write presents, the payout, the
// owner, and the verdict.
func (s *Service) fenced(ctx context.Context, step, id string, h fencewire.Holder, write func(context.Context) (api.Payout, error)) (api.Payout, error) {
	ctx, span := fencing.StartSpan(ctx, FencePoint, step, h.Token, s.fencing,
		attribute.String(tracing.AttrPayoutID, id), attribute.String(tracing.AttrLockOwner, h.Owner))
	p, err := write(ctx)
	if err == nil {
		span.SetAttributes(attribute.String(tracing.AttrAccountID, p.AccountID), attribute.String(tracing.AttrLockKey, payoutevent.Event{AccountID: p.AccountID}.LockKey()))
	}
	fencing.EndSpan(span, err)
	return p, err
}

// claim is claimTx in its fence span.
func (s *Service) claim(ctx context.Context, id string, h fencewire.Holder, terms api.ClaimRequest) (api.Payout, error) {
	return s.fenced(ctx, StepClaim, id, h, func(ctx context.Context) (api.Payout, error) { return s.claimTx(ctx, id, h, terms) })
}

// result is resultTx in its fence span.
func (s *Service) result(ctx context.Context, id string, h fencewire.Holder, req api.ResultRequest) (api.Payout, error) {
	return s.fenced(ctx, StepResult, id, h, func(ctx context.Context) (api.Payout, error) { return s.resultTx(ctx, id, h, req) })
}

// attention is attentionTx in its fence span.
func (s *Service) attention(ctx context.Context, id string, h fencewire.Holder, reason api.AttentionReason) (api.Payout, error) {
	return s.fenced(ctx, StepAttention, id, h, func(ctx context.Context) (api.Payout, error) { return s.attentionTx(ctx, id, h, reason) })
}

// resolve is resolveTx in its fence span (an ACK or DECLINE resolution
// nests a result span).
func (s *Service) resolve(ctx context.Context, id string, h fencewire.Holder, req api.ResolutionRequest) (api.Payout, error) {
	return s.fenced(ctx, StepResolution, id, h, func(ctx context.Context) (api.Payout, error) { return s.resolveTx(ctx, id, h, req) })
}

// SpanPublish is the name of the outbox's span of one message published
// (kind producer).
const SpanPublish = "payout.publish"

// startPublish starts the publish span of outbox row id, child of the
// trace context its creation stored in attrs (the POST /v1/payouts
// request's span), and returns the attributes to publish: attrs with the
// publish span's context written in (tracing.Inject), so that the
// executor's span of the delivery is its child.
func startPublish(ctx context.Context, id int64, orderingKey string, attrs map[string]string) (context.Context, trace.Span, map[string]string) {
	ctx = tracing.Extract(ctx, attrs)
	ctx, span := tracing.Tracer(tracerName).Start(ctx, SpanPublish, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			attribute.String("messaging.system", "gcp_pubsub"),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.gcp_pubsub.message.ordering_key", orderingKey),
			attribute.Int64("payout.outbox_id", id),
			attribute.String(tracing.AttrPayoutID, attrs[payoutevent.AttrPayoutID]),
			attribute.String(tracing.AttrAccountID, attrs[payoutevent.AttrAccountID]),
		))
	out := make(map[string]string, len(attrs)+2)
	for k, v := range attrs {
		out[k] = v
	}
	tracing.Inject(ctx, out)
	return ctx, span, out
}

// endPublish ends a publish span with err's status.
func endPublish(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
