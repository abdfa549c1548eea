package month

import (
	"context"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/harness/gameday"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

// TestShortMonth is the month's short version (make test): a month on
// PostgreSQL with one fault, lockdb down for 3 s, on the real stack and a
// real Prometheus. The budget of lock-acquire-availability must be spent
// under the fault's name, and none of it by the healthy lead-in.
func TestShortMonth(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack")
	}
	for _, bin := range []string{gameday.BinPrometheus, gameday.BinAlertmanager} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s not on PATH in CI (.ci/run installs Debian's prometheus and prometheus-alertmanager)", bin)
			}
			t.Skipf("%s not on PATH (apt-get install prometheus prometheus-alertmanager); CI fails instead of skipping", bin)
		}
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Repo, cfg.Dir = repo, t.TempDir()
	cfg.Healthy, cfg.Settle, cfg.Drain = 5*time.Second, 2*time.Second, time.Minute
	cfg.Faults = []Fault{{Name: "lockdb-failover", Backend: stack.BackendPostgres, PerMonth: 1, Down: 3 * time.Second, Parts: []string{stack.ClusterLockdb}}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // the stack's build on a cold cache included
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + rep.Markdown())
	a := result(t, rep, "lock-acquire-availability")
	if got := a.SpentBy["lockdb-failover"]; !(got > 0) {
		t.Errorf("lock-acquire-availability: budget spent by lockdb-failover = %v, want > 0 (lockdb was down 3 s under a steady load)", got)
	}
	if got := a.BadBy[Background]; got != 0 {
		t.Errorf("lock-acquire-availability: %v bad acquires booked to no fault, want 0 (the lead-in had no fault)", got)
	}
	if got := result(t, rep, "payout-safety").Bad; got != 0 {
		t.Errorf("payout-safety: %v duplicate submissions, want 0", got)
	}
}

func result(t *testing.T, rep Report, name string) SLOResult {
	t.Helper()
	for _, s := range rep.SLOs {
		if s.SLO == name {
			return s
		}
	}
	t.Fatalf("no SLO %s in the report", name)
	return SLOResult{}
}

// TestComputeScalesTheHealthyTimeOnly: a run of 100 s with a 60 s
// healthy lead-in and one 10 s fault stands for a month whose healthy
// time is 30 days less 10 s; the fault's bad events count once, the
// lead-in's are scaled; the policy names a fault that spent more than 20 %.
func TestComputeScalesTheHealthyTimeOnly(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	const slo = "lock-acquire-availability"
	r := Report{
		Backend: stack.BackendPostgres, RunStart: t0, HealthyEnd: t0.Add(60 * time.Second), RunEnd: t0.Add(100 * time.Second),
		Objectives: []Objective{{SLO: slo, Objective: 99.9}},
		HealthyBad: map[string]float64{slo: 0.001},
		RunTotal:   map[string]float64{slo: 1000}, // 10 a second
		Occurrences: []Occurrence{{At: 24 * time.Hour, Fault: "f", Cause: "f", Start: t0.Add(70 * time.Second), End: t0.Add(80 * time.Second),
			Bad: map[string]float64{slo: 6000}, Total: map[string]float64{slo: 100}}},
	}
	r.compute()
	scale := (Period - 10*time.Second).Seconds() / 60
	if math.Abs(r.Scale-scale) > 1e-6 {
		t.Errorf("Scale = %v, want %v", r.Scale, scale)
	}
	s := r.SLOs[0]
	events := 10 * Period.Seconds()
	if math.Abs(s.Events-events) > 1e-6*events {
		t.Errorf("Events = %v, want %v", s.Events, events)
	}
	budget := 0.001 * events
	if want := 6000 / budget; math.Abs(s.SpentBy["f"]-want) > 1e-9 {
		t.Errorf("SpentBy[f] = %v, want %v", s.SpentBy["f"], want)
	}
	if want := 0.001 * scale / budget; math.Abs(s.SpentBy[Background]-want) > 1e-9 {
		t.Errorf("SpentBy[%s] = %v, want %v", Background, s.SpentBy[Background], want)
	}
	if !strings.Contains(strings.Join(r.Consequences, "\n"), "postmortem") {
		t.Errorf("consequences %q: want a postmortem for a fault that spent %.0f %% of the budget", r.Consequences, 100*s.SpentBy["f"])
	}
}
