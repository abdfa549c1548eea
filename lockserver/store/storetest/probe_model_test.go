package storetest

import (
	"testing"

	"github.com/anishathalye/porcupine"
)

// TestProbeRenewNotHeldAcrossAHandoffIsNotLinearizable: a renewal that
// overlaps the holder's handoff (the key never free) may succeed or be
// refused as stale, never as not-held: the model rejects that history,
// which etcdstore's Renew produced (TestProbeRenewRacingAHandoffIsStale).
func TestProbeRenewNotHeldAcrossAHandoffIsNotLinearizable(t *testing.T) {
	hand := lockOp{Op: "handoff", Key: "k", Owner: "a", Token: 5}
	for _, tc := range []struct {
		outcome string
		want    bool
	}{{"not-held", false}, {"stale", true}, {"ok", true}} {
		h := []porcupine.Operation{
			op(0, 0, 1, acq("a"), ok(5)),
			op(1, 2, 10, ren("a", 5), lockResult{Outcome: tc.outcome}),
			op(0, 3, 4, hand, ok(6)),
		}
		if got := porcupine.CheckOperations(lockModel, h); got != tc.want {
			t.Errorf("renew answered %s across a handoff: linearizable %v, want %v", tc.outcome, got, tc.want)
		}
	}
}
