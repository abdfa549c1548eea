package executor

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
)

// MetricAttentionUnrecorded is the name of the counter of payouts that
// need attention but whose mark could not be written (attentionUnrecorded).
const MetricAttentionUnrecorded = "executor_attention_unrecorded_total"

// attentionUnrecorded counts, by reason (one of api.AttentionReasons, every
// one present at 0), the payouts the executor judged to need attention but
// could not mark so (payout_attention_unrecorded): no lease was held, or
// payment-resource refused the mark for good (a payout or account fence
// above every grant of the account's lock refuses the mark too). The
// delivery is acknowledged, so nothing but this counter and the log line
// says the payout is stuck: it stays in its state (pending, claimed) and
// is never counted in payouts_needing_attention_total.
var attentionUnrecorded = func() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricAttentionUnrecorded,
		Help: "Payouts judged to need attention whose needs_attention mark could not be written (no lease held, or payment-resource refused it), by reason; the delivery was acknowledged and the payout left where it was.",
	}, []string{"reason"})
	for _, r := range api.AttentionReasons {
		c.WithLabelValues(string(r)) // present at 0, so the first one is an increase
	}
	return c
}()

// countUnrecorded counts one payout in attentionUnrecorded; a reason that
// is not one of api.AttentionReasons (none is made today) counts as
// api.ReasonUnclassified, so that the label set stays bounded.
func countUnrecorded(reason api.AttentionReason) {
	if !slices.Contains(api.AttentionReasons, reason) {
		reason = api.ReasonUnclassified
	}
	attentionUnrecorded.WithLabelValues(string(reason)).Inc()
}
