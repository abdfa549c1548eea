// Package slo reads the project's service level objectives (ops/slo.yaml)
// and generates the Prometheus rules that watch them: per SLO, recording
// rules of its error ratio over every alert window and multi-window,
// multi-burn-rate alerts in the style of the Google SRE workbook (chapter 5,
// "Alerting on SLOs"); per symptom, one alert for what an SLO cannot see.
//
// The spec is the only place an objective, a window or an alert is written:
// ops/prometheus/rules.yml and the game day's compressed copy
// (ops/prometheus/gameday/rules.yml, every window divided by Options.Scale)
// are generated from it by ops/cmd/slogen, and a test keeps the committed
// files equal to the generator's output. docs/slo.md explains the
// objectives and the error-budget policy.
//
// An SLO with objective 100 has no error budget, so burn rates mean nothing
// for it: it gets one page alert that fires while any bad event is inside
// the long window of the first page burn rate (an hour) instead.
package slo

//go:generate go run ../cmd/slogen -spec ../slo.yaml -out ../prometheus/rules.yml
//go:generate go run ../cmd/slogen -spec ../slo.yaml -out ../prometheus/gameday/rules.yml -scale 30
//go:generate go run ../cmd/slogen -spec ../slo.yaml -out ../prometheus/tests/slo-rules.yml -no-annotations -only slos
//go:generate go run ../cmd/slogen -spec ../slo.yaml -out ../prometheus/tests/symptom-rules.yml -no-annotations -only symptoms
//go:generate go run ../cmd/slogen -spec ../slo.yaml -out ../../terraform/modules/monitoring/alerts.tf -format terraform

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"
	"unicode"

	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"
)

// ErrInvalidSpec is wrapped by every error Validate reports.
var ErrInvalidSpec = errors.New("slo: invalid spec")

// Severities are the only values of an alert's severity label: page wakes
// a person (business hours on this V0 service, see docs/slo.md), ticket is
// handled within a working day.
const (
	SeverityPage   = "page"
	SeverityTicket = "ticket"
)

// Metric statuses: StatusExists (a Go file of the repository registers
// the metric), StatusPlanned (the rule is written against a name another
// change will add), StatusExternal (Prometheus or etcd expose it).
const (
	StatusExists   = "exists"
	StatusPlanned  = "planned"
	StatusExternal = "external"
)

// Spec is the parsed ops/slo.yaml.
type Spec struct {
	// Period is the SLO period over which the error budget is counted
	// (30d).
	Period model.Duration `yaml:"period"`
	// Runbooks is the folder, from the repository root, of the runbooks:
	// alert A's runbook is Runbooks/Kebab(A).md.
	Runbooks string `yaml:"runbooks"`
	// BurnRates are the alert windows, by severity (page, ticket).
	BurnRates map[string][]BurnRate `yaml:"burnRates"`
	// Metrics declares every metric a rule reads.
	Metrics []Metric `yaml:"metrics"`
	// SLOs are the objectives.
	SLOs []SLO `yaml:"slos"`
	// Symptoms are the alerts outside any SLO.
	Symptoms []Symptom `yaml:"symptoms"`
}

// BurnRate is one multi-window condition: the error ratio over Long and
// over Short both above Factor times the error budget (1 - objective).
type BurnRate struct {
	Factor float64        `yaml:"factor"`
	Long   model.Duration `yaml:"long"`
	Short  model.Duration `yaml:"short"`
}

// Metric is a metric read by a rule. Name is the base name (a histogram's,
// without _bucket, _count or _sum); Type is counter, gauge or histogram;
// From names the process that exposes it; Status is one of the Status
// constants; Note says, for a planned metric, who adds it and its shape.
// Buckets, for a histogram a rule reads by bucket, are its bucket bounds
// in seconds as the exposing process registers them: the template
// function bucket picks one of them.
type Metric struct {
	Name    string    `yaml:"name"`
	Type    string    `yaml:"type"`
	From    string    `yaml:"from"`
	Status  string    `yaml:"status"`
	Note    string    `yaml:"note,omitempty"`
	Buckets []float64 `yaml:"buckets,omitempty,flow"`
}

// SLO is one objective. Objective is in percent (99.9); SLI.Errors and
// SLI.Total are PromQL templates of the rate of bad and of all events over
// {{.Window}}. Alert names its burn-rate alerts (one per severity) or, for
// an objective of 100, its single page alert.
type SLO struct {
	Name        string  `yaml:"name"`
	Alert       string  `yaml:"alert"`
	Objective   float64 `yaml:"objective"`
	Description string  `yaml:"description"`
	SLI         struct {
		Errors string `yaml:"errors"`
		Total  string `yaml:"total"`
	} `yaml:"sli"`
}

// Symptom is an alert outside any SLO. Expr and For are templates with
// the functions window and seconds (scaled durations, see Generate);
// Summary and
// Description are Prometheus annotation templates, passed through as they
// are.
type Symptom struct {
	Alert       string `yaml:"alert"`
	Severity    string `yaml:"severity"`
	Expr        string `yaml:"expr"`
	For         string `yaml:"for,omitempty"`
	Summary     string `yaml:"summary"`
	Description string `yaml:"description"`
	// Cloud, when set, replaces Expr and For in the alert's Google Cloud
	// twin (GenerateTerraform), for a symptom whose series do not exist
	// there.
	Cloud *CloudExpr `yaml:"cloud,omitempty"`
}

// CloudExpr is what a symptom reads on Google Cloud instead of its local
// expression: Expr and For are templates as in Symptom (For empty: the
// symptom's own); Why says why the two differ.
type CloudExpr struct {
	Expr string `yaml:"expr"`
	For  string `yaml:"for,omitempty"`
	Why  string `yaml:"why"`
}

// Load reads and validates the spec at path.
func Load(path string) (*Spec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(b)
}

// Parse decodes a spec (unknown fields are an error) and validates it.
func Parse(b []byte) (*Spec, error) {
	var s Spec
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidSpec, err)
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

var alertName = regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`)

// Validate reports every problem of the spec at once, each wrapping
// ErrInvalidSpec.
func (s *Spec) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidSpec}, args...)...))
	}
	if s.Period <= 0 {
		bad("period must be positive")
	}
	if s.Runbooks == "" {
		bad("runbooks (the runbook folder) is required")
	}
	for sev, brs := range s.BurnRates {
		if sev != SeverityPage && sev != SeverityTicket {
			bad("burnRates: unknown severity %q", sev)
		}
		for _, br := range brs {
			if br.Factor <= 0 || br.Short <= 0 || br.Long <= br.Short {
				bad("burnRates.%s: need factor > 0 and long > short > 0, got %+v", sev, br)
			}
		}
	}
	if len(s.BurnRates[SeverityPage]) == 0 {
		bad("burnRates.page is required")
	}
	seen := map[string]bool{}
	for _, m := range s.Metrics {
		if seen[m.Name] {
			bad("metric %q declared twice", m.Name)
		}
		seen[m.Name] = true
		if !slices.Contains([]string{"counter", "gauge", "histogram"}, m.Type) {
			bad("metric %q: type %q is not counter, gauge or histogram", m.Name, m.Type)
		}
		if !slices.Contains([]string{StatusExists, StatusPlanned, StatusExternal}, m.Status) {
			bad("metric %q: status %q is not exists, planned or external", m.Name, m.Status)
		}
		if m.Status == StatusPlanned && m.Note == "" {
			bad("planned metric %q needs a note saying who adds it", m.Name)
		}
		if len(m.Buckets) > 0 && (m.Type != "histogram" || !slices.IsSorted(m.Buckets) || slices.Contains(m.Buckets, 0)) {
			bad("metric %q: buckets need a histogram and bounds in ascending order above 0", m.Name)
		}
	}
	alerts := map[string]bool{}
	alert := func(name string) {
		if !alertName.MatchString(name) {
			bad("alert name %q is not CamelCase", name)
		}
		if alerts[name] {
			bad("alert %q defined twice", name)
		}
		alerts[name] = true
	}
	slos := map[string]bool{}
	for _, o := range s.SLOs {
		alert(o.Alert)
		if slos[o.Name] || o.Name == "" {
			bad("slo name %q empty or repeated", o.Name)
		}
		slos[o.Name] = true
		if o.Objective <= 0 || o.Objective > 100 {
			bad("slo %q: objective %v is not in (0, 100]", o.Name, o.Objective)
		}
		if !strings.Contains(o.SLI.Errors, "{{.Window}}") || !strings.Contains(o.SLI.Total, "{{.Window}}") {
			bad("slo %q: sli.errors and sli.total must both use {{.Window}}", o.Name)
		}
		if o.Description == "" {
			bad("slo %q: description is required", o.Name)
		}
	}
	for _, y := range s.Symptoms {
		alert(y.Alert)
		if y.Severity != SeverityPage && y.Severity != SeverityTicket {
			bad("symptom %q: severity %q is not page or ticket", y.Alert, y.Severity)
		}
		if y.Expr == "" || y.Summary == "" || y.Description == "" {
			bad("symptom %q: expr, summary and description are required", y.Alert)
		}
		if y.Cloud != nil && (y.Cloud.Expr == "" || strings.TrimSpace(y.Cloud.Why) == "") {
			bad("symptom %q: cloud needs expr and why", y.Alert)
		}
	}
	return errors.Join(errs...)
}

// Kebab spells a CamelCase alert name in kebab case, the name of its
// runbook: LockStoreUnreachable is lock-store-unreachable.
func Kebab(alert string) string {
	rs := []rune(alert)
	var b strings.Builder
	for i, r := range rs {
		if unicode.IsUpper(r) {
			// A capital starts a word after a lower-case letter, and at
			// the end of an acronym (the last capital before a lower-case
			// letter): PayoutAPIErrorBudgetBurn -> payout-api-error-...
			if i > 0 && (!unicode.IsUpper(rs[i-1]) || i+1 < len(rs) && unicode.IsLower(rs[i+1])) {
				b.WriteByte('-')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// RunbookPath is alert's runbook, from the repository root.
func (s *Spec) RunbookPath(alert string) string {
	return strings.TrimSuffix(s.Runbooks, "/") + "/" + Kebab(alert) + ".md"
}

// Alerts lists every alert name of the spec, SLOs first, in spec order.
func (s *Spec) Alerts() []string {
	var out []string
	for _, o := range s.SLOs {
		out = append(out, o.Alert)
	}
	for _, y := range s.Symptoms {
		out = append(out, y.Alert)
	}
	return out
}

// Options shape the generated rules.
type Options struct {
	// Scale divides every window, every "for", every duration of a
	// symptom's expression and every histogram threshold of an SLI read
	// with bucket (1: real time; the game day uses 30, so that an hour is
	// two minutes and a payout's 60 s are 2 s). Default 1.
	Scale int
	// RunbookBase is prefixed to each runbook path in runbook_url (empty:
	// the path from the repository root, e.g. docs/runbooks/x.md).
	RunbookBase string
	// Source names the spec in the generated file's header.
	Source string
	// NoAnnotations leaves out every annotation: the copy that the promtool
	// unit tests (ops/prometheus/tests) load, because promtool test rules
	// compares annotations exactly and the tests are about when an alert
	// fires. Everything else is as in the full file.
	NoAnnotations bool
	// Only keeps the groups of the SLOs ("slos") or the symptoms
	// ("symptoms"); empty keeps both. The unit tests of each load only
	// their own, which makes promtool several times faster.
	Only string
}

// scaled divides d by scale, to whole seconds (at least one).
func scaled(d time.Duration, scale int) model.Duration {
	s := d / time.Duration(scale)
	s = s.Truncate(time.Second)
	if s < time.Second {
		s = time.Second
	}
	return model.Duration(s)
}

// templateFuncs are the functions of the spec's query templates at scale
// (window, seconds, bucket).
func templateFuncs(s *Spec, scale int) template.FuncMap {
	return template.FuncMap{
		"window": func(d string) (string, error) {
			pd, err := model.ParseDuration(d)
			if err != nil {
				return "", err
			}
			return scaled(time.Duration(pd), scale).String(), nil
		},
		"seconds": func(d string) (string, error) {
			pd, err := model.ParseDuration(d)
			if err != nil {
				return "", err
			}
			return strconv.FormatInt(int64(time.Duration(scaled(time.Duration(pd), scale)).Seconds()), 10), nil
		},
		// bucket is a time threshold read from a histogram's buckets (the
		// value of its le label): d scaled, which must be one of the
		// metric's declared Buckets, since a threshold between two bounds
		// cannot be read from the histogram.
		"bucket": func(metric, d string) (string, error) {
			return bucketLabel(s, metric, d, scale)
		},
	}
}

// ErrNoBucket: a bucket template names a histogram threshold that is not
// one of the metric's declared buckets at the generated scale.
var ErrNoBucket = errors.New("slo: threshold is not a bucket of the histogram")

// bucketLabel is the le label of metric's bucket at duration d divided by
// scale (whole seconds, at least one, as every scaled duration), formatted
// as Prometheus' client libraries format a bound (60, 2, 0.5). It returns
// an error wrapping ErrNoBucket when that bound is not in the metric's
// Buckets.
func bucketLabel(s *Spec, metric, d string, scale int) (string, error) {
	pd, err := model.ParseDuration(d)
	if err != nil {
		return "", err
	}
	secs := time.Duration(scaled(time.Duration(pd), scale)).Seconds()
	for _, m := range s.Metrics {
		if m.Name == metric {
			if !slices.Contains(m.Buckets, secs) {
				return "", fmt.Errorf("%w: %s at scale %d is %g s; %s has buckets %v", ErrNoBucket, d, scale, secs, metric, m.Buckets)
			}
			return strconv.FormatFloat(secs, 'f', -1, 64), nil
		}
	}
	return "", fmt.Errorf("%w: %s is not a declared metric", ErrNoBucket, metric)
}

// ruleFile is the rules.yml document.
type ruleFile struct {
	Groups []group `yaml:"groups"`
}

type group struct {
	Name     string `yaml:"name"`
	Interval string `yaml:"interval,omitempty"`
	Rules    []rule `yaml:"rules"`
}

type rule struct {
	Record      string            `yaml:"record,omitempty"`
	Alert       string            `yaml:"alert,omitempty"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for,omitempty"`
	Labels      map[string]string `yaml:"labels,omitempty"`
	Annotations map[string]string `yaml:"annotations,omitempty"`
}

// RecordName is the recording rule of an SLO's error ratio over the
// nominal window w (the name keeps the nominal window at every Scale).
func RecordName(w model.Duration) string { return "slo:sli_error:ratio_rate" + w.String() }

// Generate renders the rules file of s.
func Generate(s *Spec, opt Options) ([]byte, error) {
	f, err := build(s, opt)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Code generated by ops/cmd/slogen from %s; DO NOT EDIT.\n", opt.Source)
	if opt.NoAnnotations {
		fmt.Fprintf(&b, "# The rules of ops/prometheus/rules.yml without their annotations, for promtool test rules\n"+
			"# (which compares annotations exactly); the tests in this folder load it.\n")
	}
	if opt.Only != "" {
		fmt.Fprintf(&b, "# Only the groups of the %s.\n", opt.Only)
	}
	if opt.Scale > 1 {
		fmt.Fprintf(&b, "# Compressed time scale for the game day: every window, \"for\" and duration is divided by %d;\n"+
			"# recording rule names keep the nominal window (ratio_rate1h reads a %s window).\n",
			opt.Scale, scaled(time.Hour, opt.Scale))
	}
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(f); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// build makes the rule groups of s.
func build(s *Spec, opt Options) (ruleFile, error) {
	var f ruleFile
	if opt.Scale == 0 {
		opt.Scale = 1
	}
	if opt.Only != "" && opt.Only != "slos" && opt.Only != "symptoms" {
		return f, fmt.Errorf("slo: Only %q is not slos or symptoms", opt.Only)
	}
	if opt.Scale < 0 {
		return f, fmt.Errorf("slo: scale %d is negative", opt.Scale)
	}
	funcs := templateFuncs(s, opt.Scale)
	render := func(name, text string, data any) (string, error) {
		t, err := template.New(name).Funcs(funcs).Option("missingkey=error").Parse(text)
		if err != nil {
			return "", fmt.Errorf("slo: %s: %w", name, err)
		}
		var b strings.Builder
		if err := t.Execute(&b, data); err != nil {
			return "", fmt.Errorf("slo: %s: %w", name, err)
		}
		return strings.TrimSpace(b.String()), nil
	}
	runbook := func(alert string) string { return opt.RunbookBase + s.RunbookPath(alert) }

	// The windows every burn rate needs, shortest first.
	var windows []model.Duration
	for _, sev := range []string{SeverityPage, SeverityTicket} {
		for _, br := range s.BurnRates[sev] {
			windows = append(windows, br.Short, br.Long)
		}
	}
	slices.Sort(windows)
	windows = slices.Compact(windows)

	interval := ""
	if opt.Scale > 1 {
		interval = scaled(time.Minute, opt.Scale).String()
	}
	for _, o := range s.SLOs {
		if opt.Only == "symptoms" {
			break
		}
		g := group{Name: "slo-" + o.Name, Interval: interval}
		labels := map[string]string{"slo": o.Name}
		for _, w := range windows {
			data := struct{ Window string }{scaled(time.Duration(w), opt.Scale).String()}
			errs, err := render(o.Name+" errors", o.SLI.Errors, data)
			if err != nil {
				return f, err
			}
			total, err := render(o.Name+" total", o.SLI.Total, data)
			if err != nil {
				return f, err
			}
			g.Rules = append(g.Rules, rule{
				Record: RecordName(w),
				Expr:   "(" + errs + ")\n/\n(" + total + ")",
				Labels: labels,
			})
		}
		g.Rules = append(g.Rules, rule{
			Record: "slo:objective:ratio",
			Expr:   fmt.Sprintf("vector(%s)", formatFloat(o.Objective/100)),
			Labels: labels,
		})
		annotations := func(sev string) map[string]string {
			return map[string]string{
				"summary": fmt.Sprintf("SLO %s (objective %s %%) is burning its error budget too fast for a %s.",
					o.Name, formatFloat(o.Objective), sev),
				"description": strings.TrimSpace(o.Description) +
					" Error ratio over the long window of the condition that fired: {{ $value | humanizePercentage }}.",
				"runbook_url": runbook(o.Alert),
			}
		}
		if o.Objective == 100 {
			first := s.BurnRates[SeverityPage][0]
			g.Rules = append(g.Rules, rule{
				Alert:  o.Alert,
				Expr:   fmt.Sprintf(`%s{slo=%q} > 0`, RecordName(first.Long), o.Name),
				Labels: map[string]string{"severity": SeverityPage, "slo": o.Name},
				Annotations: map[string]string{
					"summary": fmt.Sprintf("SLO %s (objective 100 %%) saw a bad event: this must never happen.", o.Name),
					"description": strings.TrimSpace(o.Description) + fmt.Sprintf(
						" Error ratio over the last %s: {{ $value | humanizePercentage }}.", first.Long),
					"runbook_url": runbook(o.Alert),
				},
			})
			f.Groups = append(f.Groups, g)
			continue
		}
		budget := formatFloat(1 - o.Objective/100)
		for _, sev := range []string{SeverityPage, SeverityTicket} {
			brs := s.BurnRates[sev]
			if len(brs) == 0 {
				continue
			}
			var parts []string
			for _, br := range brs {
				parts = append(parts, fmt.Sprintf(
					"(\n  %s{slo=%q} > (%s * %s)\nand\n  %s{slo=%q} > (%s * %s)\n)",
					RecordName(br.Long), o.Name, formatFloat(br.Factor), budget,
					RecordName(br.Short), o.Name, formatFloat(br.Factor), budget))
			}
			a := annotations(sev)
			g.Rules = append(g.Rules, rule{
				Alert:       o.Alert,
				Expr:        strings.Join(parts, "\nor\n"),
				Labels:      map[string]string{"severity": sev, "slo": o.Name},
				Annotations: a,
			})
		}
		f.Groups = append(f.Groups, g)
	}
	g := group{Name: "symptoms", Interval: interval}
	for _, y := range s.Symptoms {
		expr, err := render(y.Alert+" expr", y.Expr, nil)
		if err != nil {
			return f, err
		}
		var forDur string
		if y.For != "" {
			if forDur, err = render(y.Alert+" for", y.For, nil); err != nil {
				return f, err
			}
		}
		g.Rules = append(g.Rules, rule{
			Alert:  y.Alert,
			Expr:   expr,
			For:    forDur,
			Labels: map[string]string{"severity": y.Severity},
			Annotations: map[string]string{
				"summary":     strings.TrimSpace(y.Summary),
				"description": strings.TrimSpace(y.Description),
				"runbook_url": runbook(y.Alert),
			},
		})
	}
	if opt.Only != "slos" {
		f.Groups = append(f.Groups, g)
	}

	if opt.NoAnnotations {
		for i := range f.Groups {
			for j := range f.Groups[i].Rules {
				f.Groups[i].Rules[j].Annotations = nil
			}
		}
	}
	return f, nil
}

// ReportQuery is the PromQL of one SLO's figures over a whole period, for
// the monthly report on a live deployment.
type ReportQuery struct {
	SLO       string
	Objective float64
	// SLI is the good fraction of the period's events (compare with
	// Objective / 100).
	SLI string
	// BudgetSpent is the fraction of the error budget the period's bad
	// events used (1: all of it); empty for an objective of 100, whose
	// budget is zero: there, any value of SLI below 1 is a breach.
	BudgetSpent string
}

// SLIQuery is the PromQL of one SLO's event rates over a window.
type SLIQuery struct {
	SLO       string
	Objective float64
	// Errors and Total are the per-second rates of bad events and of all
	// events over the window: times its length, their counts.
	Errors, Total string
}

// SLIs returns, for each SLO, its SLI templates rendered over window (a
// PromQL duration: 30d, 1500ms).
func (s *Spec) SLIs(window string) ([]SLIQuery, error) {
	var out []SLIQuery
	for _, o := range s.SLOs {
		data := struct{ Window string }{window}
		var q [2]string
		for i, text := range []string{o.SLI.Errors, o.SLI.Total} {
			t, err := template.New(o.Name).Funcs(templateFuncs(s, 1)).Option("missingkey=error").Parse(text)
			if err != nil {
				return nil, fmt.Errorf("slo: %s: %w", o.Name, err)
			}
			var b strings.Builder
			if err := t.Execute(&b, data); err != nil {
				return nil, fmt.Errorf("slo: %s: %w", o.Name, err)
			}
			q[i] = strings.TrimSpace(b.String())
		}
		out = append(out, SLIQuery{SLO: o.Name, Objective: o.Objective, Errors: q[0], Total: q[1]})
	}
	return out, nil
}

// Report returns, for each SLO, the queries of its monthly report: the
// SLI templates rendered over the spec's period (a ratio of rates over a
// window is the ratio of the events in it).
func Report(s *Spec) ([]ReportQuery, error) {
	slis, err := s.SLIs(s.Period.String())
	if err != nil {
		return nil, err
	}
	var out []ReportQuery
	for _, q := range slis {
		ratio := "(" + q.Errors + ") / (" + q.Total + ")"
		r := ReportQuery{SLO: q.SLO, Objective: q.Objective, SLI: "1 - " + ratio}
		if q.Objective < 100 {
			r.BudgetSpent = "(" + ratio + ") / " + formatFloat(1-q.Objective/100)
		}
		out = append(out, r)
	}
	return out, nil
}

// formatFloat writes f in the shortest form that reads back as f.
func formatFloat(f float64) string {
	// 1 - 0.999 is 0.0010000000000000009 in float64: round to 12 digits.
	return strconv.FormatFloat(f, 'g', 12, 64)
}
