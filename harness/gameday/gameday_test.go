package gameday

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// repoRoot is the repository root (the package is harness/gameday).
func repoRoot(t *testing.T) string {
	t.Helper()
	abs, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// needTools skips without Prometheus and Alertmanager, except in CI
// (CI set), where .ci/run installs them and their absence is a failure.
func needTools(t *testing.T) {
	t.Helper()
	for _, bin := range []string{BinPrometheus, BinAlertmanager} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s not on PATH in CI (.ci/run installs Debian's %s)", bin, debianPackage(bin))
			}
			t.Skipf("%s not on PATH (apt-get install %s); CI fails instead of skipping", bin, debianPackage(bin))
		}
	}
}

// TestShortGameDay is the game day's short version (make test): the
// stack, a real Prometheus and Alertmanager, and five faults: lock-server
// killed (LockServerDown), a forged token at rail-proxy
// (FenceUnverifiedTokens), payment-resource killed and rail-proxy killed
// (FunctionDown, each) and lock-server stopped with SIGSTOP
// (ProcessHung). Each alert must reach the webhook, and its runbook's
// first command must answer naming the cause.
func TestShortGameDay(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole stack")
	}
	needTools(t)
	cfg := DefaultConfig()
	cfg.Repo, cfg.Dir = repoRoot(t), t.TempDir()
	short := map[string]string{ // fault -> the alert it must fire
		"lock-server-killed":      "LockServerDown",
		"forged-token":            "FenceUnverifiedTokens",
		"payment-resource-killed": "FunctionDown",
		"rail-proxy-killed":       "FunctionDown",
		"lock-server-hung":        "ProcessHung",
	}
	cfg.Faults = []string{"lock-server-killed", "forged-token", "payment-resource-killed", "rail-proxy-killed", "lock-server-hung"}
	cfg.AlertTimeout = 60 * time.Second
	start := time.Now()
	rep, err := Run(t.Context(), cfg)
	for _, r := range rep.Results {
		t.Logf("%s (%s): fired %v after %d ms; runbook step %d ms, exit %d, confirms %v\n$ %s\n%s", r.Alert, r.Fault, r.Fired,
			r.DetectionMs, r.RunbookMs, r.RunbookExit, r.RunbookConfirms, r.RunbookCommand, r.RunbookOutput)
	}
	if err != nil {
		if b, rerr := os.ReadFile(filepath.Join(cfg.Dir, "prometheus.log")); rerr == nil && errors.Is(err, ErrNotFired) {
			t.Logf("prometheus.log (tail):\n%s", tail(string(b), 20))
		}
		t.Fatal(err)
	}
	if len(rep.Results) != len(short) {
		t.Fatalf("%d results; want %d", len(rep.Results), len(short))
	}
	for _, r := range rep.Results {
		if r.Alert != short[r.Fault] {
			t.Errorf("fault %s: result for %s; want %s", r.Fault, r.Alert, short[r.Fault])
		}
		if !r.Fired || r.DetectionMs <= 0 {
			t.Errorf("%s: fired %v after %d ms", r.Alert, r.Fired, r.DetectionMs)
		}
		if !r.RunbookConfirms {
			t.Errorf("%s: the runbook's first command did not name the cause:\n$ %s\n%s", r.Alert, r.RunbookCommand, r.RunbookOutput)
		}
	}
	t.Logf("short game day: %v", time.Since(start).Round(time.Second))
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestEveryAlertIsFiredOrExplained: each alert of the game-day rules is
// either fired by a fault or listed in NotFiredLocally with a reason, and
// every alert of the faults has a runbook with a first diagnostic command.
func TestEveryAlertIsFiredOrExplained(t *testing.T) {
	repo := repoRoot(t)
	b, err := os.ReadFile(filepath.Join(repo, "ops/prometheus/gameday/rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var alerts []string
	for _, m := range regexp.MustCompile(`(?m)^\s*- alert: (\w+)`).FindAllSubmatch(b, -1) {
		if !slices.Contains(alerts, string(m[1])) {
			alerts = append(alerts, string(m[1]))
		}
	}
	if len(alerts) < 10 {
		t.Fatalf("%d alerts in the game-day rules; the parser is broken", len(alerts))
	}
	fired := map[string]bool{}
	for _, f := range Faults {
		for _, a := range f.Alerts {
			fired[a] = true
			if _, err := runbookCommand(repo, a); err != nil {
				t.Errorf("fault %s, alert %s: %v", f.Name, a, err)
			}
			if _, err := regexp.Compile(f.Confirms[a]); err != nil || f.Confirms[a] == "" {
				t.Errorf("fault %s, alert %s: no valid Confirms pattern", f.Name, a)
			}
		}
	}
	for _, a := range alerts {
		if fired[a] && NotFiredLocally[a] != "" {
			t.Errorf("%s is fired by a fault and listed as not fired locally", a)
		}
		if !fired[a] && NotFiredLocally[a] == "" {
			t.Errorf("%s: no fault fires it and NotFiredLocally does not say why", a)
		}
	}
	for a := range NotFiredLocally {
		if !slices.Contains(alerts, a) {
			t.Errorf("NotFiredLocally names %s, which is not an alert", a)
		}
	}
}

// TestVerdict: a game day fails when an alert did not fire and when a
// fired alert's runbook step did not name the cause; it passes only when
// every alert fired and was confirmed.
func TestVerdict(t *testing.T) {
	ok := Result{Alert: "A", Fault: "f", Fired: true, RunbookConfirms: true}
	for _, tc := range []struct {
		name    string
		results []Result
		want    []error
	}{
		{"all confirmed", []Result{ok, ok}, nil},
		{"not fired", []Result{ok, {Alert: "B", Fault: "g"}}, []error{ErrNotFired}},
		{"not confirmed", []Result{ok, {Alert: "B", Fault: "g", Fired: true}}, []error{ErrNotConfirmed}},
		{"both", []Result{{Alert: "B", Fault: "g", Fired: true}, {Alert: "C", Fault: "h"}}, []error{ErrNotFired, ErrNotConfirmed}},
	} {
		rep := Report{Results: tc.results}
		err := verdict(&rep)
		if len(tc.want) == 0 && err != nil {
			t.Errorf("%s: verdict = %v; want nil", tc.name, err)
		}
		if len(tc.want) > 0 && err == nil {
			t.Errorf("%s: verdict = nil; want %v", tc.name, tc.want)
		}
		for _, w := range tc.want {
			if !errors.Is(err, w) {
				t.Errorf("%s: verdict = %v; want it to wrap %v", tc.name, err, w)
			}
		}
	}
	rep := Report{Results: []Result{{Alert: "B", Fault: "g", Fired: true}}}
	_ = verdict(&rep)
	if !slices.Equal(rep.NotConfirmed, []string{"B/g"}) {
		t.Errorf("NotConfirmed = %v; want [B/g]", rep.NotConfirmed)
	}
}

// TestPhases: the executor-path faults run on a stack of their own,
// between the PostgreSQL and the etcd phases, and the short game day's
// faults need no executor path (TestShortGameDay keeps its length).
func TestPhases(t *testing.T) {
	var names []string
	for _, f := range Faults {
		names = append(names, f.Name)
	}
	phs := phasesOf(names)
	if len(phs) != 4 || phs[0].executes || !phs[1].executes || phs[1].backend != "postgres" || phs[2].backend != "etcd" || !phs[3].links {
		t.Fatalf("phases: %+v; want postgres, postgres with executors, etcd, postgres with links", phs)
	}
	for _, f := range phs[1].faults {
		if f.Backend != "" && f.Backend != "postgres" {
			t.Errorf("executor-path fault %s on backend %s", f.Name, f.Backend)
		}
	}
	if len(phs[1].faults) != 10 {
		t.Errorf("%d executor-path faults; want 10", len(phs[1].faults))
	}
	// rail-paid-no-debit's payment stays in the rail's journal, so every
	// later reconciler pass of the phase would page again: it runs last.
	if last := phs[1].faults[len(phs[1].faults)-1]; last.Name != "rail-paid-no-debit" {
		t.Errorf("the executor path ends with %s; want rail-paid-no-debit", last.Name)
	}
	for _, ph := range phasesOf([]string{"lock-server-killed", "forged-token", "payment-resource-killed", "rail-proxy-killed", "lock-server-hung"}) {
		if ph.executes {
			t.Error("the short game day's faults start the executor path")
		}
	}
}

// TestPayoutsNotCompletingIsExpectedOnlyWithoutTheExecutorPath: a phase
// that creates payouts and executes none fires PayoutsNotCompleting by
// design, so its faults' reports list it apart from "also fired"; in a
// phase that executes payouts it means payouts stopped, and stays there.
func TestPayoutsNotCompletingIsExpectedOnlyWithoutTheExecutorPath(t *testing.T) {
	const alert = "PayoutsNotCompleting"
	rules, err := os.ReadFile(filepath.Join(repoRoot(t), "ops/prometheus/gameday/rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(rules), "alert: "+alert+"\n") {
		t.Fatalf("the game-day rules have no alert %s", alert)
	}
	var names []string
	for _, f := range Faults {
		names = append(names, f.Name)
	}
	at := time.Now()
	received := map[string]time.Time{alert: at, "FunctionDown": at, "LockServerDown": at, "LockServerDown/page": at}
	for _, ph := range phasesOf(names) {
		also, byPhase := otherAlerts(received, []string{"LockServerDown"}, ph.expected())
		wantAlso, wantByPhase := []string{"FunctionDown"}, []string{alert}
		if ph.executes {
			wantAlso, wantByPhase = []string{"FunctionDown", alert}, nil
		}
		if !slices.Equal(also, wantAlso) || !slices.Equal(byPhase, wantByPhase) {
			t.Errorf("phase %s (executes %v): also fired %q, expected by the phase %q; want %q, %q",
				ph.backend, ph.executes, also, byPhase, wantAlso, wantByPhase)
		}
	}
}

func TestRunbookPath(t *testing.T) {
	if got := RunbookPath("LockServerDown"); got != filepath.Join("docs", "runbooks", "lock-server-down.md") {
		t.Errorf("RunbookPath = %s", got)
	}
}

// TestPrometheusConfigHasOneJobPerName: the etcd members are three
// targets of one job; Prometheus refuses a configuration that names a job
// twice (the etcd phase's reload failed that way).
func TestPrometheusConfigHasOneJobPerName(t *testing.T) {
	path := filepath.Join(t.TempDir(), "prometheus.yml")
	err := writePrometheusConfig(path, "rules.yml", "127.0.0.1:1", []Target{
		{Job: "lock-server", Addr: "127.0.0.1:2"},
		{Job: "etcd", Addr: "127.0.0.1:3"}, {Job: "etcd", Addr: "127.0.0.1:4"}, {Job: "etcd", Addr: "127.0.0.1:5"},
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), `job_name: "etcd"`); n != 1 {
		t.Errorf("job etcd named %d times; want 1:\n%s", n, b)
	}
	if !strings.Contains(string(b), `targets: ["127.0.0.1:3", "127.0.0.1:4", "127.0.0.1:5"]`) {
		t.Errorf("the etcd job does not list its three members:\n%s", b)
	}
	if _, err := exec.LookPath("promtool"); err == nil {
		if out, err := exec.Command("promtool", "check", "config", "--syntax-only", path).CombinedOutput(); err != nil {
			t.Errorf("promtool check config: %v\n%s", err, out)
		}
	}
}

// TestAnAlertThatFiresAgainIsReceivedAgain: an alert that fired, ended and
// fires again (the latency burn fired by the machine's load before its
// fault, then by the fault) reaches the receiver the second time, while
// another alert of the same name stays firing. With send_resolved off,
// Alertmanager's notification log kept the first firing as current and
// held the second back for repeat_interval (an hour): the full game day of
// 2026-12-01 21:52 failed on LockAcquireLatencyBudgetBurn that way.
func TestAnAlertThatFiresAgainIsReceivedAgain(t *testing.T) {
	needTools(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	recv, err := startReceiver()
	if err != nil {
		t.Fatal(err)
	}
	defer recv.close()
	amPort, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	clusterPort, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "alertmanager.yml")
	if err := writeAlertmanagerConfig(cfg, recv.url); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", amPort)
	am, err := startDaemon("alertmanager", BinAlertmanager, filepath.Join(dir, "alertmanager.log"),
		"--config.file="+cfg, "--storage.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, fmt.Sprintf("--cluster.listen-address=127.0.0.1:%d", clusterPort))
	if err != nil {
		t.Fatal(err)
	}
	defer am.stop()
	if err := awaitReady(ctx, am, "http://"+addr+"/-/ready"); err != nil {
		t.Fatal(err)
	}
	// post sends the burn's page (ended when page is false) and its
	// ticket (always firing) as Prometheus would.
	post := func(pageFiring bool) {
		t.Helper()
		now := time.Now().UTC()
		pageEnd := now.Add(5 * time.Minute)
		if !pageFiring {
			pageEnd = now.Add(-time.Second)
		}
		body := fmt.Sprintf(`[{"labels":{"alertname":"Burn","severity":"page"},"startsAt":%q,"endsAt":%q},
{"labels":{"alertname":"Burn","severity":"ticket"},"startsAt":%q,"endsAt":%q}]`,
			now.Add(-time.Minute).Format(time.RFC3339), pageEnd.Format(time.RFC3339),
			now.Add(-time.Minute).Format(time.RFC3339), now.Add(5*time.Minute).Format(time.RFC3339))
		resp, err := http.Post("http://"+addr+"/api/v2/alerts", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("posting alerts: %s", resp.Status)
		}
	}
	pageResolved := func() bool { recv.mu.Lock(); defer recv.mu.Unlock(); _, ok := recv.resolved["Burn/page"]; return ok }

	post(true)
	if _, err := recv.await(ctx, "Burn/page"); err != nil {
		t.Fatalf("first firing never received: %v", err)
	}
	// The page ends; wait for the notification of its end, which is what
	// lets Alertmanager see the next firing as new. Without it (resolutions
	// not sent) the test goes on after 30 s and fails below, on what the
	// game day saw.
	post(false)
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	for !pageResolved() && rctx.Err() == nil {
		select {
		case <-rctx.Done():
			t.Log("the end of the page was not notified within 30 s")
		case <-recv.notify:
		case <-time.After(200 * time.Millisecond):
		}
	}
	recv.reset()
	post(true)
	actx, acancel := context.WithTimeout(ctx, 30*time.Second)
	defer acancel()
	if _, err := recv.await(actx, "Burn/page"); err != nil {
		t.Fatalf("the page fired again and was not received: %v", err)
	}
}
