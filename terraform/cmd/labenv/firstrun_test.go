package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/labsetup"
)

// runLabenv runs one labenv command against f and returns its exit code,
// stdout and stderr.
func runLabenv(t *testing.T, f *fakeCloud, opts *clientOptions, grants *[]map[string]json.RawMessage, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := newLabenv(f, opts, &stdout, &stderr, grants).run(context.Background(), args)
	return code, stdout.String(), stderr.String()
}

// TestFirstRunFromAnEmptyProjectToZero is a user's first day, as
// docs/cloud.md lists it: make plan, make deploy, make destroy on a project
// where only Service Usage is on, against fakes that answer as Google does
// then: every other API 403 SERVICE_DISABLED until enabled and for a
// minute after, a binding naming a service account made less than a
// minute before 400 "does not exist" (so the first apply fails midway).
// Terraform runs a provider-free module with the real module's variables.
// It ends with the zero-billable check green.
func TestFirstRunFromAnEmptyProjectToZero(t *testing.T) {
	dir := firstRunModule(t, requiredVariables(t))
	calls := fakeCommands(t)
	f := newFakeCloud()
	opts := f.serve(t)
	var grants []map[string]json.RawMessage

	// make plan: read-only, enables nothing.
	code, stdout, stderr := runLabenv(t, f, opts, &grants, "-dir", dir, "plan")
	if code != 0 || !strings.Contains(stdout, "plan: ") {
		t.Fatalf("labenv plan on an empty project: exit %d, want 0 and the plan's counts\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "secretmanager.googleapis.com (labenv reads the signing keys before planning) is not enabled") {
		t.Errorf("labenv plan does not say Secret Manager is off:\n%s", stderr)
	}
	f.mu.Lock()
	enabled := len(f.enabled)
	f.mu.Unlock()
	if enabled != 1 {
		t.Errorf("labenv plan enabled APIs (%d on, want Service Usage alone)", enabled)
	}

	// make deploy.
	code, _, stderr = runLabenv(t, f, opts, &grants, "-dir", dir, "deploy")
	if code != 0 {
		t.Fatalf("labenv deploy on an empty project: exit %d, want 0\n%s", code, stderr)
	}
	refused := f.refused()
	for _, want := range []string{"SERVICE_DISABLED secretmanager.googleapis.com", "does not exist dlock-"} {
		if !slices.ContainsFunc(refused, func(r string) bool { return strings.HasPrefix(r, want) }) {
			t.Errorf("the fake never answered %q (refusals %v): the run was not a first run", want, refused)
		}
	}
	if !strings.Contains(stderr, "planning and applying once more") {
		t.Errorf("labenv deploy did not retry the apply that failed on a new service account:\n%s", stderr)
	}
	// The keys: stored, and their public halves in the services' env.
	var env map[string]map[string]string
	out := stateOutputs(t, dir)
	if err := json.Unmarshal(out["service_env"], &env); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	for _, k := range labsetup.Keys {
		sec := f.secrets["dlock-"+k.Secret]
		if sec == nil || len(sec.versions) != 1 {
			t.Errorf("secret dlock-%s = %+v, want one version", k.Secret, sec)
			continue
		}
		sk, err := fenceproof.ParseSigningKey(string(sec.versions[0]))
		if err != nil {
			t.Errorf("secret dlock-%s's version is not a signing key: %v", k.Secret, err)
			continue
		}
		envName := map[string]string{"lock_proof_keys": "LOCK_PROOF_KEYS", "rail_receipt_keys": "RAIL_RECEIPT_KEYS", "payment_terms_keys": "PAYMENT_TERMS_KEYS"}[k.Var]
		if got := env["executor"][envName]; got != sk.VerifyKey().String() {
			t.Errorf("%s in the services' env = %q, want the stored key's public half %q", envName, got, sk.VerifyKey().String())
		}
	}
	if len(f.services) != 5 || len(f.instances) != 2 {
		t.Errorf("after deploy: %d Cloud Run services, %d Cloud SQL instances; want 5 and 2", len(f.services), len(f.instances))
	}
	f.mu.Unlock()
	if len(grants) != 1 || len(grants[0]["pay_instance"]) == 0 {
		t.Errorf("schema grants ran %d times (outputs %v), want once with the instances", len(grants), grants)
	}
	cmds, _ := os.ReadFile(calls)
	for _, want := range []string{"kubectl apply -f -", "gcloud builds submit --project lab-1", "_REPO=europe-west1-docker.pkg.dev/lab-1/dlock-images"} {
		if !strings.Contains(string(cmds), want) {
			t.Errorf("deploy never ran %q; commands:\n%s", want, cmds)
		}
	}

	// make destroy, and the zero-billable check.
	code, stdout, stderr = runLabenv(t, f, opts, &grants, "-dir", dir, "destroy")
	if code != 0 || !strings.Contains(stdout, "zero billable resources of the lab in lab-1") {
		t.Fatalf("labenv destroy: exit %d, want 0 and the zero-billable check green\n%s\n%s", code, stdout, stderr)
	}
	// GKE's own objects first, and their disks waited for, before
	// terraform destroy removes the cluster under them.
	cmds, _ = os.ReadFile(calls)
	del := strings.Index(string(cmds), "kubectl delete --ignore-not-found --wait -f lockserver/deploy/lock-server.yaml -f etcd/deploy/etcd.yaml")
	wait := strings.Index(string(cmds), "kubectl wait --for=delete persistentvolume --all")
	if del < 0 || wait < del {
		t.Errorf("destroy did not delete lock-server's and etcd's objects and then wait for their volumes; commands:\n%s", cmds)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.services)+len(f.instances)+len(f.secrets) != 0 {
		t.Errorf("after destroy: services %v, instances %v, secrets %d; want none", f.services, f.instances, len(f.secrets))
	}
}

// stateOutputs reads the fixture's outputs from its state.
func stateOutputs(t *testing.T, dir string) map[string]json.RawMessage {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "terraform.tfstate"))
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Outputs map[string]struct {
			Value json.RawMessage `json:"value"`
		} `json:"outputs"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	out := map[string]json.RawMessage{}
	for k, v := range st.Outputs {
		out[k] = v.Value
	}
	return out
}

// TestBootstrapNamesWhatItCannotFix: with Service Usage itself off, labenv
// deploy stops before Terraform with one line saying how to turn it on.
func TestBootstrapNamesWhatItCannotFix(t *testing.T) {
	dir := firstRunModule(t, requiredVariables(t))
	f := newFakeCloud()
	delete(f.enabled, "serviceusage.googleapis.com")
	opts := f.serve(t)
	code, _, stderr := runLabenv(t, f, opts, nil, "-dir", dir, "deploy")
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if n := strings.Count(stderr, "gcloud services enable serviceusage.googleapis.com --project lab-1"); n != 1 || strings.Contains(stderr, "terraform step") {
		t.Errorf("stderr names Service Usage %d times (want once) or reached terraform:\n%s", n, stderr)
	}
}

// TestAFailedApplyIsKeptUnlessAskedToDestroy: an apply that fails for a
// reason no retry fixes leaves what it made in place and says how to
// destroy it; with -destroy-on-failure labenv destroys it.
func TestAFailedApplyIsKeptUnlessAskedToDestroy(t *testing.T) {
	fakeCommands(t)
	for _, destroy := range []bool{false, true} {
		dir := firstRunModule(t, requiredVariables(t))
		f := newFakeCloud()
		f.enableAll()
		f.badImage = true
		opts := f.serve(t)
		args := []string{"-dir", dir, "deploy"}
		if destroy {
			args = append([]string{"-destroy-on-failure"}, args...)
		}
		code, _, stderr := runLabenv(t, f, opts, nil, args...)
		if code != 1 || !strings.Contains(stderr, "not found") {
			t.Fatalf("destroy-on-failure %v: exit %d, want 1 with Cloud Run's refusal\n%s", destroy, code, stderr)
		}
		f.mu.Lock()
		made := len(f.instances)
		f.mu.Unlock()
		switch {
		case !destroy && (made != 2 || !strings.Contains(stderr, "make destroy")):
			t.Errorf("kept by default: %d Cloud SQL instances left (want 2), and stderr must say make destroy:\n%s", made, stderr)
		case destroy && made != 0:
			t.Errorf("-destroy-on-failure: %d Cloud SQL instances left, want 0", made)
		}
	}
}
