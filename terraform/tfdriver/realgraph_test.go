package tfdriver_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/labsetup"
	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/tfdriver"
	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/tfpolicy"
)

// dataName turns a resource address of the real module into a
// terraform_data name: module.pubsub.google_pubsub_topic.payouts becomes
// module__pubsub__google_pubsub_topic__payouts.
func dataName(addr string) string { return strings.ReplaceAll(addr, ".", "__") }

// realGraphModule writes, into a temporary directory, a module of one
// terraform_data per resource of the real module (terraform/), each
// depending on exactly the resources its original depends on (as
// tfpolicy resolves references, variables, outputs and depends_on). Each
// appends its original address to var.trace when created, and fails when
// var.fail_at is that address. It returns the directory and the graph.
func realGraphModule(t *testing.T) (string, map[string][]string) {
	t.Helper()
	c, err := tfpolicy.Load("..")
	if err != nil {
		t.Fatal(err)
	}
	deps := c.ResourceDeps()
	addrs := make([]string, 0, len(deps))
	for a := range deps {
		addrs = append(addrs, a)
	}
	sort.Strings(addrs)
	var b strings.Builder
	b.WriteString("variable \"trace\" {\n  type = string\n}\n\nvariable \"fail_at\" {\n  type    = string\n  default = \"\"\n}\n")
	for _, a := range addrs {
		fmt.Fprintf(&b, "\nresource \"terraform_data\" %q {\n  input = %q\n", dataName(a), a)
		if len(deps[a]) > 0 {
			refs := make([]string, len(deps[a]))
			for i, d := range deps[a] {
				refs[i] = "terraform_data." + dataName(d)
			}
			fmt.Fprintf(&b, "  depends_on = [%s]\n", strings.Join(refs, ", "))
		}
		b.WriteString("  provisioner \"local-exec\" {\n    command = \"echo ${self.input} >> '${var.trace}' && test '${var.fail_at}' != '${self.input}'\"\n  }\n}\n")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.tf"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, deps
}

// TestRealModuleGraphAppliesBudgetFirstAndDestroysToZero drives the real
// module's resource graph, with terraform_data in place of every Google
// resource, through the lifecycle: everything outside the budget's own
// prerequisites is created after the budget, every resource after what it
// depends on; an apply that fails at lockdb's instance creates nothing
// that needs it, and destroy then leaves nothing. (That nothing can be
// created before the budget is proven from the source by tfpolicy's
// budget-first rule; here the order is observed.)
func TestRealModuleGraphAppliesBudgetFirstAndDestroysToZero(t *testing.T) {
	if _, err := tfdriver.FindTerraform(""); err != nil {
		t.Skipf("skipping: the lifecycle test needs a terraform binary (1.9 or later) on PATH: %v", err)
	}
	dir, deps := realGraphModule(t)
	const budget = "module.budget.google_billing_budget.lab"
	const failAt = "module.cloudsql.google_sql_database_instance.lock"
	if _, ok := deps[budget]; !ok {
		t.Fatalf("the real module has no %s", budget)
	}
	if _, ok := deps[failAt]; !ok {
		t.Fatalf("the real module has no %s", failAt)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		failAt string
	}{{"whole apply", ""}, {"apply failing at lockdb's instance", failAt}} {
		t.Run(tc.name, func(t *testing.T) {
			trace := filepath.Join(t.TempDir(), "trace")
			logs := &lockedBuffer{}
			d, err := tfdriver.New(tfdriver.Config{Dir: dir, Vars: map[string]string{"trace": trace, "fail_at": tc.failAt}, Output: logs}, quietLog(logs))
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Init(ctx); err != nil {
				t.Fatalf("%v\n%s", err, logs)
			}
			sum, err := d.Plan(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if sum.Create != len(deps) {
				t.Errorf("plan creates %d, want %d (one per resource of the real module)", sum.Create, len(deps))
			}
			applyErr := d.Apply(ctx)
			order := readTrace(t, trace)
			pos := map[string]int{}
			for i, a := range order {
				pos[a] = i
			}
			switch {
			case tc.failAt == "" && applyErr != nil:
				t.Fatalf("Apply: %v\n%s", applyErr, logs)
			case tc.failAt == "" && len(order) != len(deps):
				t.Errorf("%d resources created, want %d", len(order), len(deps))
			case tc.failAt != "" && !errors.Is(applyErr, tfdriver.ErrStep):
				t.Fatalf("Apply = %v, want the failure at %s", applyErr, tc.failAt)
			}
			// Every resource was created after what it depends on, and
			// after the budget unless the budget needs it.
			for a, i := range pos {
				for _, dep := range deps[a] {
					if j, ok := pos[dep]; !ok || j > i {
						t.Errorf("%s created before %s, which it depends on", a, dep)
					}
				}
				if b, ok := pos[budget]; !ok || (b > i && !slices.Contains(deps[budget], a)) {
					t.Errorf("%s created before the budget", a)
				}
			}
			if tc.failAt != "" {
				for a := range pos {
					if slices.Contains(deps[a], tc.failAt) {
						t.Errorf("%s was created though %s, which it needs, failed", a, tc.failAt)
					}
				}
				if _, ok := pos["module.cloudsql.google_sql_database.lockdb"]; ok {
					t.Error("lockdb was created on an instance that failed")
				}
			}
			if err := d.Destroy(ctx); err != nil {
				t.Fatalf("Destroy: %v\n%s", err, logs)
			}
			if left, err := d.StateResources(ctx); err != nil || len(left) != 0 {
				t.Errorf("state after destroy = %v (err %v), want empty", left, err)
			}
		})
	}
}

// TestFirstDeployAppliesTheSecretsAloneBudgetFirst is labenv's first
// deploy on the real module's graph: a plan targeted at the secrets'
// module creates the secrets and what they need (the budget first), and
// nothing that would read a secret or bill by the hour (Cloud Run, Cloud
// SQL, GKE); the full plan after it creates the rest.
func TestFirstDeployAppliesTheSecretsAloneBudgetFirst(t *testing.T) {
	if _, err := tfdriver.FindTerraform(""); err != nil {
		t.Skipf("skipping: the lifecycle test needs a terraform binary (1.9 or later) on PATH: %v", err)
	}
	dir, deps := realGraphModule(t)
	const budget = "module.budget.google_billing_budget.lab"
	var targets []string
	want := map[string]bool{}
	var need func(a string)
	need = func(a string) {
		if want[a] {
			return
		}
		want[a] = true
		for _, d := range deps[a] {
			need(d)
		}
	}
	for a := range deps {
		if strings.HasPrefix(a, labsetup.SecretsTarget+".") {
			targets = append(targets, "terraform_data."+dataName(a))
			need(a)
		}
	}
	if len(targets) == 0 {
		t.Fatalf("the real module has no resource under %s", labsetup.SecretsTarget)
	}
	sort.Strings(targets)
	ctx := context.Background()
	trace := filepath.Join(t.TempDir(), "trace")
	logs := &lockedBuffer{}
	d, err := tfdriver.New(tfdriver.Config{Dir: dir, Vars: map[string]string{"trace": trace}, Output: logs}, quietLog(logs))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Init(ctx); err != nil {
		t.Fatalf("%v\n%s", err, logs)
	}
	t.Cleanup(func() { _ = d.Destroy(context.Background()) })
	sum, err := d.Plan(ctx, targets...)
	if err != nil {
		t.Fatalf("%v\n%s", err, logs)
	}
	if sum.Create != len(want) {
		t.Errorf("targeted plan creates %d, want %d (the secrets and what they need)", sum.Create, len(want))
	}
	if err := d.Apply(ctx); err != nil {
		t.Fatalf("%v\n%s", err, logs)
	}
	order := readTrace(t, trace)
	if len(order) == 0 || (order[0] != budget && !slices.Contains(deps[budget], order[0])) {
		t.Errorf("first created: %v, want the budget (or what it needs) first", order)
	}
	for i, a := range order {
		if !want[a] {
			t.Errorf("the targeted apply created %s, which the secrets do not need", a)
		}
		for _, billable := range []string{"google_cloud_run_v2_service", "google_sql_database_instance", "google_container_cluster"} {
			if strings.Contains(a, billable) {
				t.Errorf("the targeted apply created %s (position %d) before the keys exist", a, i)
			}
		}
	}
	full, err := d.Plan(ctx)
	if err != nil {
		t.Fatalf("%v\n%s", err, logs)
	}
	if full.Create != len(deps)-len(want) {
		t.Errorf("the full plan after it creates %d, want the remaining %d", full.Create, len(deps)-len(want))
	}
}
