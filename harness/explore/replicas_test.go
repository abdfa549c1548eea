package explore_test

import (
	"slices"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/pipelinetest"
	"github.com/distributed-lock-lab/distributed-lock-lab/harness/explore"
)

// withRestart is allFaults and a lock-server restart.
var withRestart = append(slices.Clone(allFaults), explore.FaultRestart)

// lock-server as its Deployment runs it: two replicas over one lock
// store, A and C talking to the first, B and the reconciler to the
// second, and one replica restarted at some point of the schedule (its
// token floor forgotten). A seeded sample of two configurations (two
// executors with faults on the lease; two executors, the reconciler and
// faults of every kind) must pass every check, and must have restarted
// each replica and had a restarted replica grant, or it proves little.
func TestSampledReplicasWithARestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	n := 20
	if *full {
		n = *samples
	}
	t.Logf("seed %d (-explore.seed), %d schedules of each configuration", *seed, n)
	x := explore.New(t, pipelinetest.Options{LockReplicas: 2})
	restarts := map[string]int{}
	restartedGrants := 0
	start := time.Now()
	for _, cfg := range []explore.Config{
		{Holders: 2, MaxFaults: 2, Faults: []string{explore.FaultExpire, explore.FaultRevoke, explore.FaultRestart}},
		{Holders: 2, Reconciler: true, MaxFaults: 2, Faults: withRestart},
	} {
		explored(t, func(visit func(explore.Result) bool) (int, error) {
			return x.Sample(t.Context(), cfg, *seed, n, func(r explore.Result) bool {
				for _, c := range r.Schedule {
					if c.Step == explore.FaultRestart {
						restarts[c.Holder]++
					}
				}
				restartedGrants += r.RestartedGrants
				return visit(r)
			})
		})
	}
	t.Logf("restarts by replica: %v; grants by a restarted replica: %d; %v", restarts, restartedGrants, time.Since(start).Round(time.Millisecond))
	for _, l := range []string{"L1", "L2"} {
		if restarts[l] == 0 {
			t.Errorf("no schedule of the sample restarted lock-server replica %s", l)
		}
	}
	if restartedGrants == 0 {
		t.Error("no restarted lock-server replica granted a lease in the sample")
	}
}

// A (first replica) and B (second) each post a payout of the account;
// then the first replica restarts, forgetting the tokens it issued, and
// grants C's redelivery of A's payout: its token must still be above
// B's, which the first replica never saw, or the fences refuse it.
func TestReplicaRestartSchedule(t *testing.T) {
	x := explore.New(t, pipelinetest.Options{LockReplicas: 2})
	s, err := explore.ParseSchedule("A:acquire A:claim A:confirm A:submit A:rail A:report A:release " +
		"B:acquire B:claim B:confirm B:submit B:rail B:report B:release L1:restart C:acquire C:claim C:release")
	if err != nil {
		t.Fatal(err)
	}
	res, err := x.Replay(t.Context(), explore.Config{Holders: 3, Payouts: 2, MaxFaults: 1, Faults: []string{explore.FaultRestart}}, s)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range res.Violations {
		t.Error(v)
	}
	if want := []string{"posted", "posted"}; !slices.Equal(res.Ended, want) {
		t.Errorf("payouts ended %v; want %v", res.Ended, want)
	}
	if res.RestartedGrants != 1 {
		t.Errorf("%d grants by the restarted replica; want 1 (C's)", res.RestartedGrants)
	}
}
