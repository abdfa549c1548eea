package explore_test

import (
	"slices"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/pipelinetest"
	"github.com/distributed-lock-lab/distributed-lock-lab/harness/explore"
)

// The explorer's fences check can fail (audit and rail-once are shown
// failing in explore_test.go; ended-lease on the parent commit, see
// harness/README.md; grant-tokens cannot be reached through lock-server,
// whose token floor refuses a grant not above one it issued before the
// explorer could see it, TestServerWithdrawsATokenNotAboveOneItIssued): with payment-resource's fence point off, a stale holder's
// claim lands after the new holder's, with a lower token.
func TestExplorerFencesCheckCanFail(t *testing.T) {
	x := explore.New(t, pipelinetest.Options{PaymentFencingOff: true})
	s, err := explore.ParseSchedule("A:acquire expire B:acquire B:claim A:claim A:confirm A:release B:confirm B:submit B:rail B:report B:release")
	if err != nil {
		t.Fatal(err)
	}
	res, err := x.Replay(t.Context(), explore.Config{Holders: 2, MaxFaults: 1, Faults: []string{explore.FaultExpire}}, s)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(res.Checks, explore.CheckFences) {
		t.Fatalf("checks broken %v (%v); want %s", res.Checks, res.Violations, explore.CheckFences)
	}
	t.Logf("as expected: %v", res.Violations)
}
