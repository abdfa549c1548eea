package deploytest_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/deploytest"
)

// TestCloudBuildStatesItsLimits: cloudbuild.yaml states a timeout that
// covers its rollout waits and a machine type; each broken copy is named.
func TestCloudBuildStatesItsLimits(t *testing.T) {
	load := func() *deploytest.CloudBuild {
		cb, err := deploytest.LoadCloudBuild(filepath.Join(repo, "cloudbuild.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		return cb
	}
	for _, p := range deploytest.CheckBuildLimits(load()) {
		t.Error(p)
	}
	for _, tc := range []struct {
		name string
		edit func(cb *deploytest.CloudBuild)
		want string
	}{
		{"no timeout", func(cb *deploytest.CloudBuild) { cb.Timeout = "" }, "states no timeout"},
		{"the old 10-minute default", func(cb *deploytest.CloudBuild) { cb.Timeout = "600s" }, "timeout 10m0s is less than the steps' rollout waits (20m0s)"},
		{"a longer rollout wait", func(cb *deploytest.CloudBuild) {
			for i, s := range cb.Steps {
				if s.ID == "deploy-gke" {
					s.Args = slices.Clone(s.Args)
					s.Args[len(s.Args)-1] = strings.ReplaceAll(s.Args[len(s.Args)-1], "--timeout=10m", "--timeout=30m")
					cb.Steps[i] = s
				}
			}
		}, "rollout waits (1h0m0s)"},
		{"the default machine", func(cb *deploytest.CloudBuild) { delete(cb.Options, "machineType") }, "machineType is not set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cb := load()
			tc.edit(cb)
			ps := deploytest.CheckBuildLimits(cb)
			if !slices.ContainsFunc(ps, func(p string) bool { return strings.Contains(p, tc.want) }) {
				t.Errorf("CheckBuildLimits = %q, want a problem containing %q", ps, tc.want)
			}
		})
	}
}

// What `gcloud builds submit` must leave out, and what the build reads.
var (
	uploadLeftOut = []string{
		"terraform/terraform.tfstate",
		"terraform/terraform.tfstate.backup",
		"terraform/.terraform/providers/registry.terraform.io/hashicorp/google/7.0.0/linux_amd64/terraform-provider-google_v7.0.0_x5",
		"terraform/labenv.tfplan",
		"terraform/terraform.tfvars",
		".git/config",
		"bin/labenv",
		"harness/out/run.json",
	}
	uploadKept = []string{
		"go.mod", "go.sum", "lockserver/api/go.mod", "lockserver/client/go.mod", "Dockerfile", "cloudbuild.yaml", ".gcloudignore",
		"terraform/main.tf", "terraform/.terraform.lock.hcl", "terraform/.tflint.google.hcl",
		"terraform/modules/cloudrun/main.tf", "terraform/tfpolicy/rules.go",
		"functions/cmd/executor/main.go", "lockserver/cmd/lock-server/main.go",
		"lockserver/deploy/lock-server.yaml", "etcd/deploy/etcd.yaml", "ops/slo.yaml",
	}
)

// TestUploadLeavesOutStateAndProviders: the repository's .gcloudignore
// leaves the Terraform state, the downloaded providers, plans and tfvars
// out of the build's upload (gcloud reads only the top-level .gitignore,
// not terraform/.gitignore) and keeps what the build reads; shown failing
// on a copy without the state's lines and on one that leaves out the
// module.
func TestUploadLeavesOutStateAndProviders(t *testing.T) {
	f, err := deploytest.LoadIgnoreFile(repo, ".gcloudignore")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range deploytest.CheckUpload(f, uploadLeftOut, uploadKept) {
		t.Error(p)
	}
	orig, err := os.ReadFile(filepath.Join(repo, ".gcloudignore"))
	if err != nil {
		t.Fatal(err)
	}
	gitignore, err := os.ReadFile(filepath.Join(repo, ".gitignore"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(string) string
		want string
	}{
		{"the state uploaded", func(s string) string {
			return strings.NewReplacer("**/*.tfstate\n", "", "**/*.tfstate.*\n", "").Replace(s)
		}, "terraform/terraform.tfstate would be uploaded"},
		{"only the top-level .gitignore, as gcloud generates it", func(string) string {
			return ".gcloudignore\n.git\n.gitignore\n#!include:.gitignore\n"
		}, "terraform-provider-google_v7.0.0_x5 would be uploaded"},
		{"the module left out", func(s string) string { return s + "terraform/\n" }, "terraform/main.tf is left out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			broken := tc.edit(string(orig))
			if broken == string(orig) {
				t.Fatal("the edit changed nothing")
			}
			for name, b := range map[string][]byte{".gcloudignore": []byte(broken), ".gitignore": gitignore} {
				if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			f, err := deploytest.LoadIgnoreFile(dir, ".gcloudignore")
			if err != nil {
				t.Fatal(err)
			}
			ps := deploytest.CheckUpload(f, uploadLeftOut, uploadKept)
			if !slices.ContainsFunc(ps, func(p string) bool { return strings.Contains(p, tc.want) }) {
				t.Errorf("CheckUpload = %q, want a problem containing %q", ps, tc.want)
			}
		})
	}
}
