package slo_test

import (
	"bytes"
	"errors"
	"go/ast"
	goparser "go/parser"
	"go/token"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource"
	"github.com/distributed-lock-lab/distributed-lock-lab/ops/slo"
)

// Paths from this package's folder.
const (
	repoRoot  = "../.."
	specPath  = "../slo.yaml"
	testsDir  = "../prometheus/tests"
	runbookIn = "../../docs/runbooks"
)

// generated are the committed files made from the spec, with the options
// of their go:generate line.
var generated = []struct {
	path string
	opt  slo.Options
}{
	{"../prometheus/rules.yml", slo.Options{}},
	{"../prometheus/gameday/rules.yml", slo.Options{Scale: 30}},
	{"../prometheus/tests/slo-rules.yml", slo.Options{NoAnnotations: true, Only: "slos"}},
	{"../prometheus/tests/symptom-rules.yml", slo.Options{NoAnnotations: true, Only: "symptoms"}},
}

// nonAlertRunbooks are the runbooks of docs/runbooks that are procedures,
// not the runbook of an alert, so they need name no alert.
// payout-needs-attention.md is the procedure the runbook of
// PayoutsNeedingAttention points at.
var nonAlertRunbooks = []string{
	"lockdb-clock.md",
	"lockdb-restore.md",
	"lockdb-failover.md",
	"raildb-restore.md",
	"payout-needs-attention.md",
}

func loadSpec(t *testing.T) *slo.Spec {
	t.Helper()
	s, err := slo.Load(specPath)
	if err != nil {
		t.Fatalf("load %s: %v", specPath, err)
	}
	return s
}

func parseRules(t *testing.T, path string) *rulefmt.RuleGroups {
	t.Helper()
	p := parser.NewParser(parser.Options{})
	rgs, errs := rulefmt.ParseFile(path, false, model.LegacyValidation, p, slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatalf("%s does not parse as Prometheus rules: %v", path, errors.Join(errs...))
	}
	return rgs
}

func TestCommittedRulesAreGenerated(t *testing.T) {
	s := loadSpec(t)
	for _, g := range generated {
		g.opt.Source = "ops/slo.yaml"
		want, err := slo.Generate(s, g.opt)
		if err != nil {
			t.Fatalf("generate %s: %v", g.path, err)
		}
		got, err := os.ReadFile(g.path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from what ops/slo.yaml generates; run: go generate ./ops/slo", g.path)
		}
	}
}

// TestRulesParseAndEveryAlertIsLabelled parses every generated file with
// Prometheus' own rule and PromQL parsers, and checks each alert of the
// full file: severity page or ticket, a summary, and a runbook_url that is
// its runbook's path.
func TestRulesParseAndEveryAlertIsLabelled(t *testing.T) {
	s := loadSpec(t)
	for _, g := range generated {
		parseRules(t, g.path)
	}
	rgs := parseRules(t, generated[0].path)
	n := 0
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if sev := r.Labels["severity"]; sev != slo.SeverityPage && sev != slo.SeverityTicket {
				t.Errorf("alert %s: severity %q; want page or ticket", r.Alert, sev)
			}
			if strings.TrimSpace(r.Annotations["summary"]) == "" {
				t.Errorf("alert %s has no summary annotation", r.Alert)
			}
			if got, want := r.Annotations["runbook_url"], s.RunbookPath(r.Alert); got != want {
				t.Errorf("alert %s: runbook_url %q; want %q", r.Alert, got, want)
			}
		}
	}
	if n == 0 {
		t.Fatal("no alert in the rules")
	}
}

// TestEveryAlertHasARunbook checks that each alert's runbook_url names a
// file with the four parts of a runbook that names the alert.
func TestEveryAlertHasARunbook(t *testing.T) {
	rgs := parseRules(t, generated[0].path)
	sections := []string{"## What it means", "## First diagnostic", "## Mitigation", "## Escalate"}
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			path := filepath.Join(repoRoot, filepath.FromSlash(r.Annotations["runbook_url"]))
			b, err := os.ReadFile(path)
			if err != nil {
				t.Errorf("alert %s has no runbook: %v", r.Alert, err)
				continue
			}
			text := string(b)
			if !strings.Contains(text, r.Alert) {
				t.Errorf("%s does not name its alert %s", path, r.Alert)
			}
			for _, sec := range sections {
				if !strings.Contains(text, "\n"+sec) {
					t.Errorf("%s has no %q section", path, sec)
				}
			}
			if i := strings.Index(text, "## First diagnostic"); i >= 0 && !strings.Contains(text[i:], "```") {
				t.Errorf("%s: the first diagnostic section has no command block", path)
			}
		}
	}
}

// TestEveryRunbookNamesAnAlert checks the other direction: a runbook that
// is not a listed procedure names an alert of the spec.
func TestEveryRunbookNamesAnAlert(t *testing.T) {
	s := loadSpec(t)
	entries, err := os.ReadDir(runbookIn)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".md") || slices.Contains(nonAlertRunbooks, e.Name()) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(runbookIn, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		named := false
		for _, a := range s.Alerts() {
			if e.Name() == slo.Kebab(a)+".md" && strings.Contains(string(b), a) {
				named = true
			}
		}
		if !named {
			t.Errorf("docs/runbooks/%s is the runbook of no alert (name it after an alert of ops/slo.yaml and name the alert in it, or list it in nonAlertRunbooks)", e.Name())
		}
	}
}

// metricsOf returns the metric names an expression reads.
func metricsOf(t *testing.T, expr string) []string {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		t.Fatalf("parse %q: %v", expr, err)
	}
	var out []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			out = append(out, vs.Name)
		}
		return nil
	})
	return out
}

// goSource is the text of every non-test Go file of the repository.
func goSource(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		b.Write(src)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestEveryMetricIsDeclaredAndPlannedOnesAreListed checks that every metric
// a rule or a cloud expression reads is declared in the spec; that an "exists" metric is
// registered by a Go file of the repository (a rename breaks this test, not
// the alert in silence); that a "planned" metric is not registered yet (once
// it is, its status must become exists); and it lists the planned metrics.
func TestEveryMetricIsDeclaredAndPlannedOnesAreListed(t *testing.T) {
	s := loadSpec(t)
	rgs := parseRules(t, generated[0].path)
	declared := map[string]slo.Metric{}
	for _, m := range s.Metrics {
		declared[m.Name] = m
	}
	records := map[string]bool{}
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				records[r.Record] = true
			}
		}
	}
	used := map[string]bool{}
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			for _, name := range metricsOf(t, r.Expr) {
				if records[name] {
					continue
				}
				base := name
				for _, suf := range []string{"_bucket", "_count", "_sum"} {
					if m, ok := declared[strings.TrimSuffix(name, suf)]; ok && m.Type == "histogram" {
						base = m.Name
					}
				}
				if _, ok := declared[base]; !ok {
					t.Errorf("rule %s%s reads %s, which ops/slo.yaml does not declare under metrics", r.Alert, r.Record, name)
				}
				used[base] = true
			}
		}
	}
	// The cloud expressions of the symptoms read metrics too.
	for _, y := range s.Symptoms {
		expr, _, ok, err := cloudOverride(s, y.Alert)
		if err != nil || !ok {
			continue
		}
		for _, name := range metricsOf(t, expr) {
			if _, ok := declared[name]; !ok {
				t.Errorf("the cloud expression of %s reads %s, which ops/slo.yaml does not declare under metrics", y.Alert, name)
			}
			used[name] = true
		}
	}
	src := goSource(t)
	var planned []string
	for _, m := range s.Metrics {
		if !used[m.Name] {
			t.Errorf("metric %s is declared but no rule reads it", m.Name)
		}
		registered := strings.Contains(src, `"`+m.Name+`"`)
		switch m.Status {
		case slo.StatusExists:
			if !registered {
				t.Errorf("metric %s has status exists, but no Go file of the repository spells %q", m.Name, m.Name)
			}
		case slo.StatusPlanned:
			if registered {
				t.Errorf("metric %s is registered now: set its status to exists in ops/slo.yaml and check the rules against its real shape", m.Name)
			}
			planned = append(planned, m.Name+" ("+m.From+"): "+m.Note)
		}
	}
	sort.Strings(planned)
	t.Logf("%d metrics the rules read are not served yet:\n  %s", len(planned), strings.Join(planned, "\n  "))
}

// promtoolTest is the part of a promtool unit test file this package reads.
type promtoolTest struct {
	RuleFiles []string `yaml:"rule_files"`
	Tests     []struct {
		Name           string `yaml:"name"`
		AlertRuleTests []struct {
			Alertname string `yaml:"alertname"`
			ExpAlerts []struct {
				ExpLabels map[string]string `yaml:"exp_labels"`
			} `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

func promtoolTestFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(testsDir, "*_test.yml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no promtool tests in %s (%v)", testsDir, err)
	}
	return files
}

// TestPromtoolTestsCoverEveryAlert checks that, for every alert rule (an
// alert and a severity), some promtool test expects it to fire, and that
// for every alert some test expects silence.
func TestPromtoolTestsCoverEveryAlert(t *testing.T) {
	fires := map[string]bool{}  // alert/severity
	silent := map[string]bool{} // alert
	for _, f := range promtoolTestFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var pt promtoolTest
		if err := yaml.Unmarshal(b, &pt); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if len(pt.RuleFiles) != 1 || !slices.Contains([]string{"slo-rules.yml", "symptom-rules.yml"}, pt.RuleFiles[0]) {
			t.Errorf("%s: rule_files %q; want [slo-rules.yml] or [symptom-rules.yml], generated copies of ../rules.yml", f, pt.RuleFiles)
		}
		for _, tc := range pt.Tests {
			for _, at := range tc.AlertRuleTests {
				if len(at.ExpAlerts) == 0 {
					silent[at.Alertname] = true
				}
				for _, ea := range at.ExpAlerts {
					fires[at.Alertname+"/"+ea.ExpLabels["severity"]] = true
				}
			}
		}
	}
	rgs := parseRules(t, generated[0].path)
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			if !fires[r.Alert+"/"+r.Labels["severity"]] {
				t.Errorf("no promtool test expects %s (severity %s) to fire", r.Alert, r.Labels["severity"])
			}
			if !silent[r.Alert] {
				t.Errorf("no promtool test expects %s to stay silent on healthy series", r.Alert)
			}
		}
	}
}

// TestPromtool runs promtool check rules on every generated file and
// promtool test rules on the unit tests. Without promtool it fails in CI
// (CI set) and skips elsewhere.
func TestPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool is not on PATH; .ci/run installs it (apt-get install prometheus)")
		}
		t.Skip("promtool not on PATH (apt-get install prometheus): rule checks and unit tests skipped")
	}
	run := func(t *testing.T, args ...string) {
		t.Parallel()
		if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	check := []string{"check", "rules"}
	for _, g := range generated {
		check = append(check, g.path)
	}
	t.Run("check", func(t *testing.T) { run(t, check...) })
	// One process per file: each takes seconds, and they are independent.
	for _, f := range promtoolTestFiles(t) {
		t.Run(filepath.Base(f), func(t *testing.T) { run(t, "test", "rules", f) })
	}
}

func TestCompressedScaleDividesEveryWindow(t *testing.T) {
	s := loadSpec(t)
	b, err := slo.Generate(s, slo.Options{Scale: 30})
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	for _, want := range []string{
		"[10s]",   // the 5m window of the page burn rate
		"[2m]",    // its 1h window
		"[48m]",   // the ticket's 1d window
		"[2h24m]", // the ticket's 3d window
		"> 60",    // PayoutAmbiguousTooLong's 30 minutes, in seconds
		`le="2"`,  // payout-completion's 60 s threshold, a bucket of the histogram
		"interval: 2s",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("compressed rules lack %q", want)
		}
	}
	for _, unwanted := range []string{"[5m]", "[1h]", "[1d]", "[3d]", "> 1800", `le="60"`} {
		if strings.Contains(text, unwanted) {
			t.Errorf("compressed rules still hold the real-time %q", unwanted)
		}
	}
}

// TestBucketThresholdIsABucket: a histogram threshold (the bucket template
// function) is scaled like every duration, and a scaled threshold that is
// not one of the metric's declared buckets is refused instead of reading
// an le label the histogram does not have (the SLI would count nothing).
func TestBucketThresholdIsABucket(t *testing.T) {
	spec := func(buckets string) *slo.Spec {
		s, err := slo.Parse([]byte(`
period: 30d
runbooks: docs/runbooks
burnRates:
  page: [{factor: 14.4, long: 1h, short: 5m}]
metrics:
  - {name: m_seconds, type: histogram, from: x, status: exists, buckets: ` + buckets + `}
slos:
  - name: x
    alert: XBurn
    objective: 99
    description: d
    sli:
      errors: sum(rate(m_seconds_bucket{le="{{bucket "m_seconds" "60s"}}"}[{{.Window}}]))
      total: sum(rate(m_seconds_count[{{.Window}}]))
`))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	b, err := slo.Generate(spec("[1, 2, 60]"), slo.Options{Scale: 30})
	if err != nil || !strings.Contains(string(b), `le="2"`) {
		t.Errorf("scale 30 with a bucket at 2: %v\n%s", err, b)
	}
	b, err = slo.Generate(spec("[1, 2, 60]"), slo.Options{})
	if err != nil || !strings.Contains(string(b), `le="60"`) {
		t.Errorf("scale 1: %v\n%s", err, b)
	}
	if _, err := slo.Generate(spec("[1, 5, 60]"), slo.Options{Scale: 30}); !errors.Is(err, slo.ErrNoBucket) {
		t.Errorf("scale 30 without a bucket at 2: %v; want ErrNoBucket", err)
	}
}

// TestCompletionBucketsAreTheSpecs: the buckets ops/slo.yaml declares for
// payout_completion_seconds are the ones payment-resource registers, so
// that the bucket the generator picks exists.
func TestCompletionBucketsAreTheSpecs(t *testing.T) {
	s := loadSpec(t)
	for _, m := range s.Metrics {
		if m.Name == "payout_completion_seconds" {
			if !slices.Equal(m.Buckets, paymentresource.CompletionBuckets) {
				t.Errorf("ops/slo.yaml declares buckets %v; payment-resource registers %v", m.Buckets, paymentresource.CompletionBuckets)
			}
			return
		}
	}
	t.Error("payout_completion_seconds is not declared")
}

// TestSLODocHasTheMonthlyReport checks that docs/slo.md gives, for every
// SLO, the monthly report's PromQL as the spec makes it today.
func TestSLODocHasTheMonthlyReport(t *testing.T) {
	s := loadSpec(t)
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "slo.md"))
	if err != nil {
		t.Fatal(err)
	}
	qs, err := slo.Report(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(qs) != len(s.SLOs) {
		t.Fatalf("Report gave %d queries for %d SLOs", len(qs), len(s.SLOs))
	}
	for _, q := range qs {
		for _, want := range []string{q.SLI, q.BudgetSpent} {
			if want != "" && !strings.Contains(string(doc), want) {
				t.Errorf("docs/slo.md lacks the report query of %s (go run ./ops/cmd/slogen -report):\n%s", q.SLO, want)
			}
		}
	}
}

// TestAcquireSLIClassifiesEveryLockAPICode reads the error codes declared
// in lockserver/api and checks that the lock-acquire-availability SLI
// counts each one as good, as bad, or leaves it out as the caller's mistake
// (or not an acquire answer), so that a new code cannot drop out of the SLI
// unnoticed.
func TestAcquireSLIClassifiesEveryLockAPICode(t *testing.T) {
	fset := token.NewFileSet()
	f, err := goparser.ParseFile(fset, filepath.Join(repoRoot, "lockserver", "api", "api.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var codes []string
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok {
			return true
		}
		if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Code" {
			return true
		}
		for _, v := range vs.Values {
			if lit, ok := v.(*ast.BasicLit); ok {
				c, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatal(err)
				}
				codes = append(codes, c)
			}
		}
		return true
	})
	if len(codes) < 5 {
		t.Fatalf("found only %d codes in lockserver/api/api.go: %q", len(codes), codes)
	}
	codes = append(codes, "OK", "OTHER") // lock-server's metrics add these two

	s := loadSpec(t)
	var sli *slo.SLO
	for i := range s.SLOs {
		if s.SLOs[i].Name == "lock-acquire-availability" {
			sli = &s.SLOs[i]
		}
	}
	if sli == nil {
		t.Fatal("no SLO lock-acquire-availability in the spec")
	}
	codeSet := func(expr string) map[string]bool {
		e, err := parser.NewParser(parser.Options{}).ParseExpr(strings.ReplaceAll(expr, "{{.Window}}", "5m"))
		if err != nil {
			t.Fatal(err)
		}
		set := map[string]bool{}
		parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
			if vs, ok := n.(*parser.VectorSelector); ok {
				for _, m := range vs.LabelMatchers {
					if m.Name == "code" {
						for _, c := range strings.Split(m.Value, "|") {
							set[c] = true
						}
					}
				}
			}
			return nil
		})
		return set
	}
	bad, total := codeSet(sli.SLI.Errors), codeSet(sli.SLI.Total)
	// Not counted: the caller's mistakes, a caller that gave up before the
	// answer, and answers no acquire gives.
	excluded := []string{"INVALID_REQUEST", "BODY_TOO_LARGE", "UNSUPPORTED_MEDIA_TYPE", "NOT_FOUND",
		"METHOD_NOT_ALLOWED", "LEASE_NOT_HELD", "STALE_TOKEN", "REQUEST_CANCELLED"}
	for c := range bad {
		if !total[c] {
			t.Errorf("code %s is bad but not in the total", c)
		}
	}
	for _, c := range codes {
		if !total[c] && !slices.Contains(excluded, c) {
			t.Errorf("code %s of lockserver/api is neither counted by lock-acquire-availability nor excluded: classify it in ops/slo.yaml (or here)", c)
		}
		if total[c] && slices.Contains(excluded, c) {
			t.Errorf("code %s is counted and excluded at once", c)
		}
	}
	for _, must := range []string{"BACKEND_UNAVAILABLE", "INTERNAL"} {
		if !bad[must] {
			t.Errorf("%s is not a bad acquire", must)
		}
	}
	for _, must := range []string{"OK", "LOCK_HELD"} {
		if !total[must] || bad[must] {
			t.Errorf("%s is not a good acquire", must)
		}
	}
}

func TestKebab(t *testing.T) {
	for in, want := range map[string]string{
		"LockStoreUnreachable":     "lock-store-unreachable",
		"EtcdNoLeader":             "etcd-no-leader",
		"A":                        "a",
		"PayoutAPIErrorBudgetBurn": "payout-api-error-budget-burn",
		"APIDown":                  "api-down",
		"EdgeAPI":                  "edge-api",
	} {
		if got := slo.Kebab(in); got != want {
			t.Errorf("Kebab(%q) = %q; want %q", in, got, want)
		}
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	bad := []byte(`
period: 0s
runbooks: ""
burnRates:
  page: [{factor: 14.4, long: 5m, short: 1h}]
  pager: []
metrics:
  - {name: m, type: summary, status: maybe}
slos:
  - {name: x, alert: lowerCase, objective: 120, description: d, sli: {errors: a, total: b}}
symptoms:
  - {alert: lowerCase, severity: urgent, expr: up, summary: s, description: d}
`)
	_, err := slo.Parse(bad)
	if !errors.Is(err, slo.ErrInvalidSpec) {
		t.Fatalf("Parse(bad) = %v; want ErrInvalidSpec", err)
	}
	for _, want := range []string{
		"period", "runbooks", "long > short", `unknown severity "pager"`, "summary", "maybe",
		"CamelCase", `alert "lowerCase" defined twice`, "objective 120", "{{.Window}}", `severity "urgent"`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if _, err := slo.Parse([]byte("period: 30d\nunknown: 1\n")); !errors.Is(err, slo.ErrInvalidSpec) {
		t.Errorf("an unknown field: %v; want ErrInvalidSpec", err)
	}
}
