package slo_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"

	"github.com/distributed-lock-lab/distributed-lock-lab/ops/slo"
)

// Paths of the cloud twin, from this package's folder.
const (
	cloudAlerts  = "../../terraform/modules/monitoring/alerts.tf"
	rootMain     = "../../terraform/main.tf"
	rootVars     = "../../terraform/variables.tf"
	monitorCall  = "./modules/monitoring"
	sentinelBase = "https://runbooks.example/"
	sentinelChan = "projects/p/notificationChannels/1"
)

// twin is one alert policy of the generated Terraform, its attributes
// evaluated with the sentinel variables above.
type twin struct {
	resource, alert, severity, query, duration, content string
	channels                                            []string
}

// loadTwins evaluates every google_monitoring_alert_policy of src, keyed
// by alert/severity (display_name and the severity user label).
func loadTwins(src []byte) (map[string]twin, error) {
	f, diags := hclsyntax.ParseConfig(src, "alerts.tf", hcl.Pos{Line: 1, Column: 1})
	if diags.HasErrors() {
		return nil, diags
	}
	ctx := &hcl.EvalContext{
		Variables: map[string]cty.Value{"var": cty.ObjectVal(map[string]cty.Value{
			"project_id":            cty.StringVal("p"),
			"notification_channels": cty.ListVal([]cty.Value{cty.StringVal(sentinelChan)}),
			"runbook_base":          cty.StringVal(sentinelBase),
			"labels":                cty.MapVal(map[string]cty.Value{"app": cty.StringVal("lab")}),
		})},
		Functions: map[string]function.Function{"merge": stdlib.MergeFunc},
	}
	str := func(b *hclsyntax.Body, name string) (string, error) {
		a := b.Attributes[name]
		if a == nil {
			return "", fmt.Errorf("no attribute %s", name)
		}
		v, diags := a.Expr.Value(ctx)
		if diags.HasErrors() || v.Type() != cty.String {
			return "", fmt.Errorf("attribute %s is not a string: %v", name, diags)
		}
		return v.AsString(), nil
	}
	child := func(b *hclsyntax.Body, typ string) *hclsyntax.Body {
		for _, bl := range b.Blocks {
			if bl.Type == typ {
				return bl.Body
			}
		}
		return &hclsyntax.Body{}
	}
	out := map[string]twin{}
	for _, bl := range f.Body.(*hclsyntax.Body).Blocks {
		if bl.Type != "resource" || len(bl.Labels) != 2 || bl.Labels[0] != "google_monitoring_alert_policy" {
			continue
		}
		tw := twin{resource: bl.Labels[1]}
		var err error
		if tw.alert, err = str(bl.Body, "display_name"); err != nil {
			return nil, fmt.Errorf("%s: %w", tw.resource, err)
		}
		if a := bl.Body.Attributes["user_labels"]; a != nil {
			v, diags := a.Expr.Value(ctx)
			if !diags.HasErrors() && v.Type().IsObjectType() && v.Type().HasAttribute("severity") {
				tw.severity = v.GetAttr("severity").AsString()
			}
		}
		if a := bl.Body.Attributes["notification_channels"]; a != nil {
			v, diags := a.Expr.Value(ctx)
			if !diags.HasErrors() && v.CanIterateElements() {
				for it := v.ElementIterator(); it.Next(); {
					_, c := it.Element()
					tw.channels = append(tw.channels, c.AsString())
				}
			}
		}
		pql := child(child(bl.Body, "conditions"), "condition_prometheus_query_language")
		if tw.query, err = str(pql, "query"); err != nil {
			return nil, fmt.Errorf("%s: %w", tw.resource, err)
		}
		if tw.duration, err = str(pql, "duration"); err != nil {
			return nil, fmt.Errorf("%s: %w", tw.resource, err)
		}
		if tw.content, err = str(child(bl.Body, "documentation"), "content"); err != nil {
			return nil, fmt.Errorf("%s: %w", tw.resource, err)
		}
		key := tw.alert + "/" + tw.severity
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("two alert policies for %s", key)
		}
		out[key] = tw
	}
	return out, nil
}

// inlineRecords replaces every selector of a recording rule in e with
// the rule's expression (Cloud Monitoring evaluates no recording rules);
// records maps a rule's name and slo label to its expression. A record
// read as a range cannot be replaced and is an error.
func inlineRecords(e parser.Expr, records map[string]parser.Expr) (parser.Expr, error) {
	var err error
	var walk func(parser.Expr) parser.Expr
	lookup := func(vs *parser.VectorSelector) parser.Expr {
		for _, m := range vs.LabelMatchers {
			if m.Name == "slo" {
				if r, ok := records[vs.Name+"/"+m.Value]; ok {
					return r
				}
			}
		}
		return nil
	}
	walk = func(e parser.Expr) parser.Expr {
		switch n := e.(type) {
		case *parser.VectorSelector:
			if r := lookup(n); r != nil {
				return &parser.ParenExpr{Expr: r}
			}
		case *parser.MatrixSelector:
			if vs, ok := n.VectorSelector.(*parser.VectorSelector); ok && lookup(vs) != nil {
				err = fmt.Errorf("recording rule %s is read as a range", vs.Name)
			}
		case *parser.ParenExpr:
			n.Expr = walk(n.Expr)
		case *parser.UnaryExpr:
			n.Expr = walk(n.Expr)
		case *parser.BinaryExpr:
			n.LHS, n.RHS = walk(n.LHS), walk(n.RHS)
		case *parser.AggregateExpr:
			n.Expr = walk(n.Expr)
		case *parser.Call:
			for i := range n.Args {
				n.Args[i] = walk(n.Args[i])
			}
		case *parser.SubqueryExpr:
			n.Expr = walk(n.Expr)
		}
		return e
	}
	e = walk(e)
	return e, err
}

// cloudOverride renders a symptom's cloud expression and for at the real
// time scale, or returns ok false when the symptom has none.
func cloudOverride(s *slo.Spec, alert string) (expr, forDur string, ok bool, err error) {
	for _, y := range s.Symptoms {
		if y.Alert != alert || y.Cloud == nil {
			continue
		}
		funcs := template.FuncMap{
			"window": func(d string) string { return d },
			"seconds": func(d string) (string, error) {
				pd, err := model.ParseDuration(d)
				return fmt.Sprint(int64(time.Duration(pd).Seconds())), err
			},
		}
		render := func(text string) (string, error) {
			var b strings.Builder
			t, err := template.New(alert).Funcs(funcs).Parse(text)
			if err == nil {
				err = t.Execute(&b, nil)
			}
			return strings.TrimSpace(b.String()), err
		}
		if expr, err = render(y.Cloud.Expr); err != nil {
			return "", "", true, err
		}
		forDur = y.For
		if y.Cloud.For != "" {
			forDur = y.Cloud.For
		}
		forDur, err = render(forDur)
		return expr, forDur, true, err
	}
	return "", "", false, nil
}

func seconds(d string) (string, error) {
	if d == "" {
		return "0s", nil
	}
	pd, err := model.ParseDuration(d)
	return fmt.Sprintf("%ds", int64(time.Duration(pd).Seconds())), err
}

// parityProblems compares the alerts of the local rules with their cloud
// twins: each alert rule (name and severity) has exactly one twin whose
// query is the rule's expression with its recording rules inlined (or
// the symptom's declared cloud expression), whose duration is its for,
// whose documentation ends with its runbook link, and which notifies
// var.notification_channels; and no twin lacks a local alert.
func parityProblems(s *slo.Spec, rgs *rulefmt.RuleGroups, twins map[string]twin) []string {
	var out []string
	p := parser.NewParser(parser.Options{})
	seen := map[string]bool{}
	for _, g := range rgs.Groups {
		records := map[string]parser.Expr{}
		for _, r := range g.Rules {
			if r.Record != "" {
				e, err := p.ParseExpr(r.Expr)
				if err != nil {
					out = append(out, fmt.Sprintf("record %s: %v", r.Record, err))
					continue
				}
				records[r.Record+"/"+r.Labels["slo"]] = e
			}
		}
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			key := r.Alert + "/" + r.Labels["severity"]
			seen[key] = true
			tw, ok := twins[key]
			if !ok {
				out = append(out, fmt.Sprintf("%s (%s) has no cloud twin: no alert policy with display_name %q and severity label %q in %s (run go generate ./ops/slo)", r.Alert, r.Labels["severity"], r.Alert, r.Labels["severity"], cloudAlerts))
				continue
			}
			wantExpr, wantFor := r.Expr, r.For.String()
			if r.For == 0 {
				wantFor = ""
			}
			cexpr, cfor, ok, err := cloudOverride(s, r.Alert)
			if err != nil {
				out = append(out, fmt.Sprintf("%s: cloud: %v", r.Alert, err))
			}
			if ok {
				wantExpr, wantFor = cexpr, cfor
			}
			want, err := p.ParseExpr(wantExpr)
			if err == nil {
				want, err = inlineRecords(want, records)
			}
			if err != nil {
				out = append(out, fmt.Sprintf("%s: %v", key, err))
				continue
			}
			got, err := p.ParseExpr(tw.query)
			switch {
			case err != nil:
				out = append(out, fmt.Sprintf("%s: the cloud query does not parse: %v", key, err))
			case got.String() != want.String():
				out = append(out, fmt.Sprintf("%s: the cloud query differs from the local rule's\n got: %s\nwant: %s", key, got, want))
			}
			if d, err := seconds(wantFor); err != nil || tw.duration != d {
				out = append(out, fmt.Sprintf("%s: cloud duration %q; want %q (the rule's for)", key, tw.duration, d))
			}
			if want := "Runbook: " + sentinelBase + r.Annotations["runbook_url"]; !strings.HasSuffix(tw.content, want) {
				out = append(out, fmt.Sprintf("%s: the cloud documentation does not end with %q: %q", key, want, tw.content))
			}
			if len(tw.channels) != 1 || tw.channels[0] != sentinelChan {
				out = append(out, fmt.Sprintf("%s: notifies %q, not var.notification_channels", key, tw.channels))
			}
		}
	}
	for key := range twins {
		if !seen[key] {
			out = append(out, fmt.Sprintf("alert policy %s is the twin of no local alert", key))
		}
	}
	return out
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func parseRulesBytes(t *testing.T, b []byte) *rulefmt.RuleGroups {
	t.Helper()
	rgs, errs := rulefmt.Parse(b, false, model.LegacyValidation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatalf("rules do not parse: %v", errs)
	}
	return rgs
}

func TestCommittedCloudAlertsAreGenerated(t *testing.T) {
	want, err := slo.GenerateTerraform(loadSpec(t), "ops/slo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, cloudAlerts); !bytes.Equal(got, want) {
		t.Errorf("%s differs from what ops/slo.yaml generates; run: go generate ./ops/slo", cloudAlerts)
	}
}

// TestEveryAlertHasACloudTwin: every alert of ops/prometheus/rules.yml has
// an alert policy on Google Cloud with the same expression (recording
// rules inlined, or the symptom's declared cloud expression), its for and
// its runbook link, notifying the user's channels; and the root module
// deploys those policies with the user's channels.
func TestEveryAlertHasACloudTwin(t *testing.T) {
	s := loadSpec(t)
	twins, err := loadTwins(readFile(t, cloudAlerts))
	if err != nil {
		t.Fatal(err)
	}
	rgs := parseRules(t, generated[0].path)
	for _, p := range parityProblems(s, rgs, twins) {
		t.Error(p)
	}
	n := 0
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				n++
			}
		}
	}
	if len(twins) != n || n < 20 {
		t.Errorf("%d alert policies for %d alert rules", len(twins), n)
	}
	if err := deployedWithChannels(readFile(t, rootMain), readFile(t, rootVars)); err != nil {
		t.Error(err)
	}
}

// deployedWithChannels checks that the root module calls the monitoring
// module, passing var.notification_channels, a variable it declares.
func deployedWithChannels(mainTF, varsTF []byte) error {
	f, diags := hclsyntax.ParseConfig(mainTF, "main.tf", hcl.Pos{Line: 1, Column: 1})
	if diags.HasErrors() {
		return diags
	}
	v, diags := hclsyntax.ParseConfig(varsTF, "variables.tf", hcl.Pos{Line: 1, Column: 1})
	if diags.HasErrors() {
		return diags
	}
	declared := false
	for _, b := range v.Body.(*hclsyntax.Body).Blocks {
		declared = declared || b.Type == "variable" && len(b.Labels) == 1 && b.Labels[0] == "notification_channels"
	}
	if !declared {
		return fmt.Errorf("terraform/variables.tf declares no notification_channels")
	}
	for _, b := range f.Body.(*hclsyntax.Body).Blocks {
		if b.Type != "module" || b.Body.Attributes["source"] == nil {
			continue
		}
		src, _ := b.Body.Attributes["source"].Expr.Value(nil)
		if src.Type() != cty.String || src.AsString() != monitorCall {
			continue
		}
		a := b.Body.Attributes["notification_channels"]
		if a == nil {
			return fmt.Errorf("module %s passes no notification_channels", b.Labels[0])
		}
		tr, ok := a.Expr.(*hclsyntax.ScopeTraversalExpr)
		if !ok || len(tr.Traversal) != 2 || tr.Traversal.RootName() != "var" || tr.Traversal[1].(hcl.TraverseAttr).Name != "notification_channels" {
			return fmt.Errorf("module %s: notification_channels is not var.notification_channels", b.Labels[0])
		}
		return nil
	}
	return fmt.Errorf("terraform/main.tf calls no module with source %q", monitorCall)
}

// TestParityFailsOnBrokenTwins shows the parity check failing on broken
// copies: a twin removed, an expression changed, a runbook link changed,
// the channels dropped, a local alert added without a twin, a cloud
// expression declared but not deployed, the module not called.
func TestParityFailsOnBrokenTwins(t *testing.T) {
	tf := string(readFile(t, cloudAlerts))
	rules := string(readFile(t, generated[0].path))
	mainTF := string(readFile(t, rootMain))
	// replaceAfter replaces the first old after anchor in s.
	replaceAfter := func(s, anchor, old, new string) string {
		i := strings.Index(s, anchor)
		j := strings.Index(s[max(i, 0):], old)
		if i < 0 || j < 0 {
			t.Fatalf("%q after %q not found", old, anchor)
		}
		return s[:i+j] + new + s[i+j+len(old):]
	}
	policy := func(name string) string { return `resource "google_monitoring_alert_policy" "` + name + `"` }
	cut := func(s, from, to string) string {
		i, j := strings.Index(s, from), strings.Index(s, to)
		if i < 0 || j < i {
			t.Fatalf("%q ... %q not found", from, to)
		}
		return s[:i] + s[j:]
	}
	for _, tc := range []struct {
		name              string
		tf, rules, mainTF string
		dropCloud         string // a symptom whose cloud expression the spec loses
		want              string
	}{
		{name: "a twin removed", want: "FunctionDown (page) has no cloud twin",
			tf: cut(tf, policy("function_down_page"), policy("fence_unverified_tokens_page"))},
		{name: "an expression changed", want: "LockServerDown/page: the cloud query differs",
			tf: replaceAfter(tf, policy("lock_server_down_page"), `== 0`, `== 1`)},
		{name: "a recording rule not inlined", want: "PayoutSubmittedTwice/page: the cloud query differs",
			tf: replaceAfter(tf, policy("payout_submitted_twice_page"), `query               = "`,
				`query               = "slo:sli_error:ratio_rate1h{slo=\"payout-safety\"} > 0 or `)},
		{name: "a runbook link changed", want: "EtcdNoLeader/page: the cloud documentation does not end with",
			tf: replaceAfter(tf, policy("etcd_no_leader_page"), "docs/runbooks/etcd-no-leader.md", "docs/runbooks/etcd.md")},
		{name: "a for changed", want: "PayoutOutboxStuck/page: cloud duration",
			tf: replaceAfter(tf, policy("payout_outbox_stuck_page"), `duration            = "180s"`, `duration            = "0s"`)},
		{name: "channels dropped", want: "PayoutAuditMismatch/page: notifies",
			tf: replaceAfter(tf, policy("payout_audit_mismatch_page"), "var.notification_channels", "[]")},
		{name: "an alert added without a twin", want: "NewAlert (ticket) has no cloud twin",
			rules: replaceAfter(rules, "  - name: symptoms\n", "    rules:\n", "    rules:\n      - alert: NewAlert\n        expr: vector(1)\n        labels:\n          severity: ticket\n")},
		{name: "a cloud expression declared, the local one deployed", want: "FunctionDown/page: the cloud query differs",
			dropCloud: "FunctionDown"},
		{name: "the module not called", want: "calls no module",
			mainTF: replaceAfter(mainTF, "", `"./modules/monitoring"`, `"./modules/monitor"`)},
		{name: "the channels not passed", want: "is not var.notification_channels",
			mainTF: replaceAfter(mainTF, `"./modules/monitoring"`, "var.notification_channels", "[]")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var problems []string
			if tc.mainTF != "" {
				if err := deployedWithChannels([]byte(tc.mainTF), readFile(t, rootVars)); err != nil {
					problems = append(problems, err.Error())
				}
			} else {
				if tc.tf == "" {
					tc.tf = tf
				}
				if tc.rules == "" {
					tc.rules = rules
				}
				s := loadSpec(t)
				for i := range s.Symptoms {
					if s.Symptoms[i].Alert == tc.dropCloud {
						s.Symptoms[i].Cloud = nil
					}
				}
				twins, err := loadTwins([]byte(tc.tf))
				if err != nil {
					t.Fatal(err)
				}
				problems = parityProblems(s, parseRulesBytes(t, []byte(tc.rules)), twins)
			}
			for _, p := range problems {
				if strings.Contains(p, tc.want) {
					return
				}
			}
			t.Errorf("no problem says %q; got %q", tc.want, problems)
		})
	}
}
