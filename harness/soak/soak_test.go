package soak_test

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutaudit"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/harness/benche2e"
	"github.com/distributed-lock-lab/distributed-lock-lab/harness/soak"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

var seed = flag.Uint64("soak.seed", 0, "seed of the short soaks (0: drawn and logged)")

// good returns the records of a run where every rule holds: p-1 posted
// (one ACK, one debit), p-2 declined, p-3 failed (never at the rail), p-4
// waiting for a person with its reason.
func good() soak.Records {
	return soak.Records{
		Expected: []string{"p-1", "p-2", "p-3", "p-4"},
		Payouts: []soak.PayoutRecord{
			{ID: "p-1", State: "posted"}, {ID: "p-2", State: "declined"},
			{ID: "p-3", State: "failed"}, {ID: "p-4", State: "needs_attention", Reason: "rail_fence_ahead"},
		},
		Journal: []rail.Submission{
			{Seq: 1, Request: rail.SubmitRequest{PayoutID: "p-1"}, Answer: rail.SubmitAnswer{Status: rail.StatusAck, RailRef: "rail-000001"}},
			{Seq: 2, Request: rail.SubmitRequest{PayoutID: "p-2"}, Answer: rail.SubmitAnswer{Status: rail.StatusDecline, RailRef: "rail-000002"}},
		},
		Debits: map[string]int{"p-1": 1},
		Audit:  payoutaudit.Report{Balanced: true},
	}
}

// Each check holds on good records and fails on records broken in its
// one way, naming the payout.
func TestCheckFailsOnEachBrokenRule(t *testing.T) {
	if got := soak.Check(good()); len(got) != 0 {
		t.Fatalf("Check(good) = %q; want no failure", got)
	}
	for _, c := range []struct {
		name, want string
		brk        func(*soak.Records)
	}{
		{"payout missing from paydb", soak.CheckNoneLost + ": payout p-5 is not in paydb", func(r *soak.Records) { r.Expected = append(r.Expected, "p-5") }},
		{"payout left claimed", soak.CheckNoneLost + ": payout p-2 was left claimed", func(r *soak.Records) { r.Payouts[1].State = "claimed" }},
		{"payout left ambiguous", soak.CheckNoneLost + ": payout p-3 was left ambiguous", func(r *soak.Records) { r.Payouts[2].State = "ambiguous" }},
		{"needs attention without a reason", soak.CheckNoneLost + ": payout p-4 needs attention without a reason", func(r *soak.Records) { r.Payouts[3].Reason = "" }},
		{"stop orders are not payments", "", func(r *soak.Records) {
			for range 2 {
				r.Journal = append(r.Journal, rail.Submission{Stop: true, Request: rail.SubmitRequest{Reference: "p-3"}, Answer: rail.SubmitAnswer{Status: rail.StatusStopped}})
			}
		}},
		{"second submission at the rail", soak.CheckRailOnce + ": payout p-2 reached the rail 2 times", func(r *soak.Records) {
			r.Journal = append(r.Journal, rail.Submission{Seq: 3, Request: rail.SubmitRequest{PayoutID: "p-2"}, Answer: rail.SubmitAnswer{Status: rail.StatusDecline}})
		}},
		{"audit unbalanced", soak.CheckLedgerBalances + ": ledger_balances acct-1: off by 5", func(r *soak.Records) {
			r.Audit = payoutaudit.Report{Violations: []payoutaudit.Violation{{Check: "ledger_balances", Subject: "acct-1", Detail: "off by 5"}}}
		}},
		{"rail paid twice, one debit", soak.CheckOneDebit + ": payout p-1: the rail paid it 2 times, the ledger debits it 1 times", func(r *soak.Records) {
			r.Journal = append(r.Journal, rail.Submission{Seq: 3, Request: rail.SubmitRequest{PayoutID: "p-1"}, Answer: rail.SubmitAnswer{Status: rail.StatusAck}})
		}},
		{"rail payment without debit", soak.CheckOneDebit + ": payout p-1: the rail paid it 1 times, the ledger debits it 0 times", func(r *soak.Records) { r.Debits = map[string]int{} }},
		{"debit without rail payment", soak.CheckOneDebit + ": payout p-3: 1 debits and no payment at the rail", func(r *soak.Records) { r.Debits["p-3"] = 1 }},
		{"two debits", soak.CheckOneDebit + ": payout p-1: the rail paid it 1 times, the ledger debits it 2 times", func(r *soak.Records) { r.Debits["p-1"] = 2 }},
		{"posted without rail payment", soak.CheckOneDebit + ": payout p-1 is posted and the rail never paid it", func(r *soak.Records) {
			r.Journal = r.Journal[1:]
			r.Debits = map[string]int{}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := good()
			r.Payouts = slices.Clone(r.Payouts)
			c.brk(&r)
			got := soak.Check(r)
			if c.want == "" {
				if len(got) != 0 {
					t.Errorf("Check = %q; want no failure", got)
				}
				return
			}
			if !slices.Contains(got, c.want) {
				t.Errorf("Check = %q; want it to contain %q", got, c.want)
			}
		})
	}
}

func TestValidateReportsEveryInvalidField(t *testing.T) {
	cfg := soak.DefaultConfig()
	cfg.Backend, cfg.Payouts, cfg.KillGap = "redis", 0, 0
	err := cfg.Validate()
	for _, field := range []string{"Backend", "Payouts", "KillGap"} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("Validate = %v; want it to name %s", err, field)
		}
	}
	if err := soak.DefaultConfig().Validate(); err != nil {
		t.Errorf("DefaultConfig().Validate() = %v", err)
	}
}

// buildOnce returns the folder of the stack's binaries
// (stack.CachedBinaries: built once for every package of the test run).
func buildOnce(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	bin, err := stack.CachedBinaries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// runDir returns a new run folder for a soak (every process's log, the
// rail's journal): removed when the test passes, kept when it fails, with
// its path in the test's output, since a failure is read from it.
func runDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "soak-"+strings.ReplaceAll(t.Name(), "/", "-")+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("run folder kept: %s", dir)
			return
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove the run folder: %v", err)
		}
	})
	return dir
}

func shortConfig(t *testing.T, backend, bin string) soak.Config {
	cfg := soak.DefaultConfig()
	cfg.Backend, cfg.BinDir, cfg.Dir = backend, bin, runDir(t)
	cfg.Payouts, cfg.Accounts, cfg.Rate = 300, 30, 60
	cfg.KillGap, cfg.DownTime, cfg.Rounds, cfg.MaxRounds = 300*time.Millisecond, 100*time.Millisecond, 1, 1
	cfg.Seed = *seed
	if cfg.Seed == 0 {
		cfg.Seed = soak.NewSeed()
	}
	cfg.Log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	t.Logf("seed %d (rerun: go test ./harness/soak -run %s -soak.seed %d)", cfg.Seed, t.Name(), cfg.Seed)
	return cfg
}

// TestShortCrashSoak is the soak in CI: a few hundred payouts on each
// backend, one SIGKILL of every kind of part (an etcd member: the leader),
// on etcd network faults on the links beside the kills, and the four
// outcomes asserted from the records.
func TestShortCrashSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack twice and kills every part (about a minute)")
	}
	bin := buildOnce(t)
	for _, backend := range []string{stack.BackendPostgres, stack.BackendEtcd} {
		t.Run(backend, func(t *testing.T) {
			// Most of a run is spent waiting for restarts (PostgreSQL's
			// crash recovery): the two backends overlap well on 2 cores.
			t.Parallel()
			cfg := shortConfig(t, backend, bin)
			// The end-to-end benchmark's measurements (make bench-e2e) ride
			// on this run, so that they cannot rot without a stack of their
			// own: its figures mean nothing under chaos, its code runs.
			var m benche2e.Measurement
			cfg.StatementStats = true
			cfg.Observe = benche2e.Observer(&m, benche2e.ObserverConfig{Statements: true})
			if backend == stack.BackendEtcd {
				// Kills and network faults side by side, as `make soak
				// SOAK_FAULTS=kill,net` runs them, held shorter.
				cfg.Faults, cfg.NetHold = []string{soak.FaultsKill, soak.FaultsNet}, 500*time.Millisecond
			}
			if backend == stack.BackendPostgres {
				// After the verdict on the real records: break them and
				// expect every check to fail (shown on one backend; the
				// checks do not depend on it).
				cfg.Break = breakRecords
			}
			t0 := time.Now()
			rep, err := soak.Run(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %v for %d payouts; outcomes %v, paths %v, kills %d, rail %d submissions, %d ACKs, %d debits",
				backend, time.Since(t0).Round(time.Millisecond), rep.Payouts, rep.Outcomes, rep.Paths, len(rep.Kills), rep.RailSubmissions, rep.RailAcks, rep.Debits)
			for _, k := range rep.Kills {
				t.Logf("kill %s at %.1f s: ready after %d ms", k.Process, k.AtS, k.ReadyMs)
			}
			for _, f := range rep.NetFaults {
				t.Logf("network fault %s on %s at %.1f s, held %d ms", f.Fault, f.Link, f.AtS, f.HoldMs)
			}
			if slices.Contains(cfg.Faults, soak.FaultsNet) && len(rep.NetFaults) == 0 {
				t.Error("no network fault was held during the load")
			}
			for _, f := range rep.Failures {
				t.Errorf("broken: %s", f)
			}
			var kinds []string
			leader := false
			for _, k := range rep.Kills {
				kinds = append(kinds, k.Target)
				leader = leader || k.Leader != nil && *k.Leader
			}
			slices.Sort(kinds)
			want := soak.Targets(backend, cfg.Executors)
			slices.Sort(want)
			if !slices.Equal(kinds, want) {
				t.Errorf("killed %v; want one kill of each of %v", kinds, want)
			}
			if backend == stack.BackendEtcd && !leader {
				t.Error("no etcd kill hit the leader")
			}
			if n := rep.Outcomes["posted"]; n == 0 {
				t.Errorf("no payout posted: %v", rep.Outcomes)
			}
			checkMeasurement(t, m, backend, rep.Outcomes["posted"], cfg.Executors)
			if cfg.Break != nil {
				for _, want := range []string{soak.CheckNoneLost, soak.CheckRailOnce, soak.CheckOneDebit, soak.CheckLedgerBalances} {
					if !slices.ContainsFunc(rep.FailuresAfterBreak, func(f string) bool { return strings.HasPrefix(f, want+":") }) {
						t.Errorf("after breaking the records: failures %q; want one of %q", rep.FailuresAfterBreak, want)
					}
				}
			}
			for _, p := range rep.NeedsAttention {
				t.Logf("needs attention: %s (%s): %s", p.ID, p.Reason, strings.Join(p.History, "; "))
			}
		})
	}
}

// checkMeasurement checks what benche2e's observer measured on a run
// of backend with posted payouts and executors executor processes.
func checkMeasurement(t *testing.T, m benche2e.Measurement, backend string, posted, executors int) {
	t.Helper()
	t.Logf("bench measurement: %d payouts in %.1f s (%.1f/s), latency %v ms, deliveries %v, CPU per payout %v ms",
		m.Payouts, m.Seconds, m.PayoutsPerSecond, m.LatencyMs, m.Deliveries, m.CPUPerPayoutMs)
	if m.Payouts != posted || m.PayoutsPerSecond <= 0 {
		t.Errorf("measured %d payouts at %.1f/s; want the %d posted at a positive rate", m.Payouts, m.PayoutsPerSecond, posted)
	}
	if !(m.LatencyMs["p50"] > 0 && m.LatencyMs["p50"] <= m.LatencyMs["p95"] && m.LatencyMs["p95"] <= m.LatencyMs["p99"] && m.LatencyMs["p99"] <= m.LatencyMs["max"]) {
		t.Errorf("latency percentiles %v; want 0 < p50 <= p95 <= p99 <= max", m.LatencyMs)
	}
	total := 0
	for _, n := range m.Deliveries {
		total += n
	}
	// A killed executor's counter starts again at its restart: the sum
	// may fall short of the payouts under chaos, never reach zero.
	if len(m.Deliveries) != executors || total <= 0 {
		t.Errorf("deliveries %v; want one count per executor (%d), summing to more than 0", m.Deliveries, executors)
	}
	for _, p := range []string{"lock-server", "payment-resource", "rail-proxy", "executor-A", "postgres-paydb", "bench"} {
		if m.CPUSeconds[p] <= 0 {
			t.Errorf("CPU of %s = %v s; want > 0 (all: %v)", p, m.CPUSeconds[p], m.CPUSeconds)
		}
	}
	if m.CPUPerPayoutMs["total"] <= 0 {
		t.Errorf("CPU per payout %v; want a positive total", m.CPUPerPayoutMs)
	}
	// The statement counts start again at a restart of their cluster (a
	// kill of paydb, maybe after the last payout was created): what
	// matters here is that they are read, per database, and add up. The
	// outbox's publisher reads paydb all along.
	var paydb int64
	for _, s := range m.Statements {
		if s.Database == "paydb" {
			paydb += s.Calls
		}
	}
	if paydb <= 0 || m.StatementsPerPayout["paydb"] <= 0 || m.StatementsPerPayout["total"] < m.StatementsPerPayout["paydb"] {
		t.Errorf("statements: %d in paydb, per payout %v; want paydb's counted and within the total", paydb, m.StatementsPerPayout)
	}
	// etcd's requests come from every member, its proposals from the
	// leader at the end, whichever member the kills left leading.
	if backend == stack.BackendEtcd {
		t.Logf("etcd per payout: %v", m.EtcdPerPayout)
		if m.EtcdPerPayout["grpc Txn"] <= 0 || m.EtcdPerPayout["proposals committed"] <= 0 {
			t.Errorf("etcd per payout %v; want Txns and the leader's proposals counted", m.EtcdPerPayout)
		}
	}
}

// breakRecords breaks the records of a settled run in the ways the soak
// must catch, through the parts' own interfaces: a second submission of a
// posted payout straight to the rail (paid twice, a rail payment with no
// debit), an account balance changed behind the ledger's back
// (unbalanced), and a posted payout put back to claimed (an executor
// never finished it: lost).
func breakRecords(ctx context.Context, st *stack.Stack) error {
	paydb, err := pgxpool.New(ctx, st.PayDBURL())
	if err != nil {
		return err
	}
	defer paydb.Close()
	if _, err := soak.PayAgainAtRail(ctx, st); err != nil {
		return err
	}
	if _, err := paydb.Exec(ctx, `UPDATE account SET balance_minor = balance_minor - 1 WHERE account_id = 'soak-acct-1'`); err != nil {
		return err
	}
	_, err = paydb.Exec(ctx, `UPDATE payout SET state = 'claimed' WHERE payout_id =
		(SELECT payout_id FROM payout WHERE state = 'posted' ORDER BY payout_id DESC LIMIT 1)`)
	return err
}

// testWriter sends log lines to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}
