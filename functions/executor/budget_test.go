package executor_test

import (
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource"
)

// One deadline budget: payment-resource gives up on a
// frozen paydb, and answers 503 (nothing written), before the executor
// gives up on payment-resource (outcome unknown to it).
func TestPaymentResourcesDeadlineIsInsideTheExecutors(t *testing.T) {
	if pay, x := paymentresource.RequestTimeout, executor.DefaultConfig().RequestTimeout; pay >= x {
		t.Fatalf("payment-resource waits %v for paydb, the executor %v for payment-resource", pay, x)
	}
}
