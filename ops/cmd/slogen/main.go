// Command slogen generates Prometheus rules from the SLO spec: recording
// rules and multi-window, multi-burn-rate alerts per SLO, and the symptom
// alerts (package ops/slo).
//
//	go run ./ops/cmd/slogen -spec ops/slo.yaml -out ops/prometheus/rules.yml
//	go run ./ops/cmd/slogen -spec ops/slo.yaml -out ops/prometheus/gameday/rules.yml -scale 30
//
// -scale divides every window and duration (the game day's compressed time
// scale); -no-annotations and -only slos|symptoms write the copies that the
// promtool unit tests in ops/prometheus/tests load;
// -runbook-base is prefixed to every runbook_url (default: paths from the
// repository root); -report prints the PromQL of the monthly report
// (docs/slo.md) instead of rules; -format terraform writes the Google
// Cloud twin of every alert instead, as Cloud Monitoring alert policies
// (terraform/modules/monitoring). Without -out the output goes to
// standard output.
//
// sloth (github.com/slok/sloth v0.16.0) was weighed and not taken: it makes the same burn-rate rules, but not the symptom pages, the 1/30 game-day copy (histogram thresholds included) or the Cloud Monitoring twins (docs/slo.md).
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/distributed-lock-lab/distributed-lock-lab/ops/slo"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "slogen:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("slogen", flag.ContinueOnError)
	spec := fs.String("spec", "ops/slo.yaml", "the SLO spec")
	out := fs.String("out", "", "the rules file to write (default: standard output)")
	scale := fs.Int("scale", 1, "divide every window and duration by this factor (game day: 60)")
	noAnn := fs.Bool("no-annotations", false, "leave out the annotations (the copy the promtool unit tests load)")
	only := fs.String("only", "", "keep only the groups of the slos or of the symptoms (the promtool unit tests' copies)")
	report := fs.Bool("report", false, "print the PromQL of the monthly report (docs/slo.md) instead of rules")
	base := fs.String("runbook-base", "", "prefix of every runbook_url (e.g. https://github.com/OWNER/REPO/blob/main/)")
	format := fs.String("format", "prometheus", "prometheus (a rules file) or terraform (the Cloud Monitoring alert policies of every alert)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	s, err := slo.Load(*spec)
	if err != nil {
		return err
	}
	if *report {
		qs, err := slo.Report(s)
		if err != nil {
			return err
		}
		for _, q := range qs {
			fmt.Printf("# %s, objective %v %%: the SLI over the period\n%s\n", q.SLO, q.Objective, q.SLI)
			if q.BudgetSpent != "" {
				fmt.Printf("# %s: the fraction of its error budget spent\n%s\n", q.SLO, q.BudgetSpent)
			}
		}
		return nil
	}
	var b []byte
	switch *format {
	case "prometheus":
		b, err = slo.Generate(s, slo.Options{Scale: *scale, RunbookBase: *base, Source: "ops/" + filepath.Base(*spec), NoAnnotations: *noAnn, Only: *only})
	case "terraform":
		b, err = slo.GenerateTerraform(s, "ops/"+filepath.Base(*spec))
	default:
		err = fmt.Errorf("-format %q is not prometheus or terraform", *format)
	}
	if err != nil {
		return err
	}
	if *out == "" {
		_, err = os.Stdout.Write(b)
		return err
	}
	return os.WriteFile(*out, b, 0o644)
}
