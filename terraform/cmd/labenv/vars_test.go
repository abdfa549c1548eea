package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"

	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/tfdriver"
)

// rootVariables is the real module's variables.tf.
const rootVariables = "../../variables.tf"

// requiredVariables returns, sorted, the variables of the real root module
// that have no default: every labenv path must give each a value.
func requiredVariables(t *testing.T) []string {
	t.Helper()
	f, diags := hclparse.NewParser().ParseHCLFile(rootVariables)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	content, diags := f.Body.Content(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "variable", LabelNames: []string{"name"}}}})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	var req []string
	for _, b := range content.Blocks {
		attrs, _ := b.Body.JustAttributes()
		if _, ok := attrs["default"]; !ok {
			req = append(req, b.Labels[0])
		}
	}
	// Nested validation blocks make JustAttributes complain; it still
	// returns the attributes it found.
	slices.Sort(req)
	if len(req) == 0 {
		t.Fatalf("%s declares no required variable: the parse is wrong", rootVariables)
	}
	return req
}

// firstRunModule copies testdata/firstrun and the real module's
// variables.tf into a temporary directory, with one more file that
// outputs every required variable's value, and returns the directory.
func firstRunModule(t *testing.T, required []string) string {
	t.Helper()
	if _, err := tfdriver.FindTerraform(""); err != nil {
		t.Skipf("skipping: needs a terraform binary (1.9 or later) on PATH: %v", err)
	}
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS("testdata/firstrun")); err != nil {
		t.Fatal(err)
	}
	vars, err := os.ReadFile(rootVariables)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "variables.tf"), vars, 0o644); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("output \"required_variables\" {\n  value = {\n")
	for _, v := range required {
		fmt.Fprintf(&b, "    %s = var.%s\n", v, v)
	}
	b.WriteString("  }\n}\n")
	if err := os.WriteFile(filepath.Join(dir, "required.tf"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// labEnv is the documented environment of `make plan/deploy/destroy`:
// the project, the billing account, and (through exists) ADC.
func labEnv(k string) string {
	return map[string]string{tfdriver.EnvProject: "lab-1", tfdriver.EnvBillingAccount: "000000-000000-000000", "HOME": "/nonexistent"}[k]
}

func adcExists(string) bool { return true }

// TestPlanAndDestroyGiveEveryRequiredVariable runs labenv plan and labenv
// destroy on a module with exactly the real module's variables, with no
// Secret Manager to read the keys from: each must reach terraform with a
// value for every variable without a default.
func TestPlanAndDestroyGiveEveryRequiredVariable(t *testing.T) {
	required := requiredVariables(t)
	dir := firstRunModule(t, required)
	for _, cmd := range []string{"plan", "destroy"} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), []string{"-dir", dir, cmd}, labEnv, adcExists, &stdout, &stderr)
		if code != 0 || strings.Contains(stderr.String(), "No value for required variable") {
			t.Errorf("labenv %s: exit %d, want 0 with every one of %v given\n%s", cmd, code, required, stderr.String())
		}
	}
}
