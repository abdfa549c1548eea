package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"

	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/bootstrap"
	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/labsetup"
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
		attrs, _, diags := b.Body.PartialContent(&hcl.BodySchema{Attributes: []hcl.AttributeSchema{{Name: "default"}}})
		if diags.HasErrors() {
			t.Fatal(diags)
		}
		if _, ok := attrs.Attributes["default"]; !ok {
			req = append(req, b.Labels[0])
		}
	}
	slices.Sort(req)
	if len(req) == 0 {
		t.Fatalf("%s declares no required variable: the parse is wrong", rootVariables)
	}
	return req
}

// firstRunModule copies testdata/firstrun (its *.tf.txt as *.tf) and the real module's
// variables.tf into a temporary directory, with one more file that
// outputs every required variable's value, and returns the directory.
func firstRunModule(t *testing.T, required []string) string {
	t.Helper()
	if _, err := tfdriver.FindTerraform(""); err != nil {
		t.Skipf("skipping: needs a terraform binary (1.9 or later) on PATH: %v", err)
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("skipping: the fixture module reaches the fake Google Cloud with curl, which is not on PATH")
	}
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS("testdata/firstrun")); err != nil {
		t.Fatal(err)
	}
	// The fixture's files are named *.tf.txt so that the scanners of make
	// lint, which walk terraform/, skip a module that is whole only here.
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil || !strings.HasSuffix(p, ".tf.txt") {
			return err
		}
		return os.Rename(p, strings.TrimSuffix(p, ".txt"))
	})
	if err != nil {
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
// the project, the billing account, and (through adcExists) ADC.
func labEnv(k string) string {
	return map[string]string{tfdriver.EnvProject: "lab-1", tfdriver.EnvBillingAccount: "000000-000000-000000", "HOME": "/nonexistent"}[k]
}

func adcExists(string) bool { return true }

// newLabenv is labenv against f, with its outputs in stdout and stderr and
// the schema grants recorded in grants.
func newLabenv(f *fakeCloud, opts *clientOptions, stdout, stderr io.Writer, grants *[]map[string]json.RawMessage) *labenv {
	return &labenv{
		getenv: labEnv, exists: adcExists, stdout: stdout, stderr: stderr, clients: opts,
		wait: bootstrap.Wait{Sleep: f.sleep},
		grants: func(_ context.Context, project string, out map[string]json.RawMessage, _ *slog.Logger) error {
			*grants = append(*grants, out)
			return nil
		},
	}
}

// requiredValues is the fixture's output of every required variable.
func requiredValues(t *testing.T, dir string) map[string]string {
	t.Helper()
	var m map[string]string
	if err := json.Unmarshal(stateOutputs(t, dir)["required_variables"], &m); err != nil {
		t.Fatalf("output required_variables: %v", err)
	}
	return m
}

// TestEveryPathGivesEveryRequiredVariable runs labenv plan, deploy and
// destroy on a module with exactly the real module's variables
// (variables.tf copied): each must reach terraform with a value for every
// variable without a default. Plan and destroy also run with Secret
// Manager off, with the keys' secrets missing, and with the latest
// version of one disabled: they read nothing they need.
func TestEveryPathGivesEveryRequiredVariable(t *testing.T) {
	required := requiredVariables(t)
	dir := firstRunModule(t, required)
	fakeCommands(t)
	f := newFakeCloud()
	opts := f.serve(t)
	var grants []map[string]json.RawMessage
	labenv := func(cmd string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		code := newLabenv(f, opts, &stdout, &stderr, &grants).run(context.Background(), []string{"-dir", dir, cmd})
		if code != 0 || strings.Contains(stderr.String(), "No value for required variable") {
			t.Fatalf("labenv %s: exit %d, want 0 with every one of %v given\n%s", cmd, code, required, stderr.String())
		}
	}
	// A fresh project: Secret Manager is off.
	labenv("plan")
	labenv("destroy")
	// Every API on, no secret yet.
	f.enableAll()
	labenv("plan")
	labenv("deploy")
	got := requiredValues(t, dir)
	for _, v := range required {
		if got[v] == "" {
			t.Errorf("after deploy, required variable %s is empty", v)
		}
	}
	for _, k := range labsetup.Keys {
		if got[k.Var] == labsetup.Placeholder {
			t.Errorf("deploy applied %s = the placeholder, want the stored key's public half", k.Var)
		}
	}
	// A disabled latest version, then a deleted secret.
	f.mu.Lock()
	f.secrets["dlock-rail-receipt-signing-key"].disabled = true
	f.mu.Unlock()
	labenv("plan")
	f.mu.Lock()
	delete(f.secrets, "dlock-payment-terms-signing-key")
	f.mu.Unlock()
	labenv("plan")
	labenv("destroy")
}
