package executor_test

import (
	"fmt"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
)

// Execute is handed an event as is (ServeHTTP decodes and validates a
// push's; a library caller may not). An event of p-1 that is not
// well-formed (a currency in lower case, an amount out of bounds) is
// dropped before any call: its terms cannot be the payout's, and the
// client's refusal to send them would otherwise read as payment-resource's
// INVALID_REQUEST, a permanent refusal that marks p-1 needs_attention
// under the lease the event took.
func TestMalformedEventIsDroppedBeforeAnyCall(t *testing.T) {
	for _, bad := range []payoutevent.Event{
		{PayoutID: "p-1", AccountID: "acct-7", AmountMinor: 2500, Currency: "eur"},
		{PayoutID: "p-1", AccountID: "acct-7", AmountMinor: 0, Currency: "EUR"},
		{PayoutID: "p-1", AccountID: "acct-7", AmountMinor: payoutevent.MaxAmountMinor + 1, Currency: "EUR"},
	} {
		t.Run(fmt.Sprintf("%d %s", bad.AmountMinor, bad.Currency), func(t *testing.T) {
			deps := &fakeDeps{railStatus: 200, railBody: `{"status":"ACK","railRef":"r"}`}
			x, _ := newExecutor(t, deps, nil)
			out, err := x.Execute(t.Context(), bad)
			if err != nil || out != executor.OutcomeDropped {
				t.Errorf("Execute(%+v) = %q, %v; want dropped", bad, out, err)
			}
			if len(deps.attentions) != 0 || deps.claimed != 0 || deps.railCalls() != 0 {
				t.Fatalf("malformed event: marks %v, %d claims, %d rail calls; want none", deps.attentions, deps.claimed, deps.railCalls())
			}
		})
	}
}
