package railproxy

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
)

// FencePoint is rail-proxy's name as a fence point, the value of
// tracing.AttrFencePoint on its fence spans.
const FencePoint = "rail-proxy"

// StepSubmission is the fenced write of a submission, the value of
// tracing.AttrFenceStep.
const StepSubmission = "submission"

// AttrAttemptID is the span attribute of a submission's attempt id.
const AttrAttemptID = "rail.attempt_id"

// FenceDuplicate is the fence outcome (tracing.AttrFenceOutcome) of a
// submission refused because the payout already went to the rail (the
// one-forward-per-payout check).
const FenceDuplicate = "duplicate"

// startFence starts the fence span of one submission (fencing.StartSpan):
// the holder's token, the payout, the account and its lock key.
func startFence(ctx context.Context, req api.SubmitRequest, h fencewire.Holder, enabled bool) (context.Context, trace.Span) {
	return fencing.StartSpan(ctx, FencePoint, StepSubmission, h.Token, enabled,
		attribute.String(tracing.AttrPayoutID, req.PayoutID),
		attribute.String(tracing.AttrAccountID, req.AccountID),
		attribute.String(tracing.AttrLockKey, payoutevent.Event{AccountID: req.AccountID}.LockKey()),
		attribute.String(tracing.AttrLockOwner, h.Owner))
}

// endFence ends the fence span with admit's verdict: accepted, refused
// (with the high-water mark), duplicate, or error.
func endFence(span trace.Span, attemptID int64, err error) {
	if attemptID > 0 {
		span.SetAttributes(attribute.Int64(AttrAttemptID, attemptID))
	}
	var dup *AlreadySubmitted
	if errors.As(err, &dup) {
		span.SetAttributes(attribute.String(tracing.AttrFenceOutcome, FenceDuplicate))
		span.End()
		return
	}
	fencing.EndSpan(span, err)
}
