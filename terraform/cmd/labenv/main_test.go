package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/tfdriver"
)

func TestEveryCommandStopsAtOnceWithoutCredentials(t *testing.T) {
	for _, cmd := range []string{"plan", "deploy", "destroy"} {
		var stdout, stderr bytes.Buffer
		dir := t.TempDir() // no module: reaching terraform would fail differently
		code := (&labenv{getenv: func(string) string { return "" }, exists: func(string) bool { return false }, stdout: &stdout, stderr: &stderr}).run(context.Background(), []string{"-dir", dir, cmd})
		if code != 2 {
			t.Errorf("%s: exit %d, want 2", cmd, code)
		}
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		if len(lines) != 1 || !strings.Contains(lines[0], "GOOGLE_CLOUD_PROJECT") || !strings.Contains(lines[0], "application-default login") {
			t.Errorf("%s: stderr %q, want one line naming the project and the credentials", cmd, stderr.String())
		}
		if stdout.Len() != 0 {
			t.Errorf("%s: wrote %q to stdout", cmd, stdout.String())
		}
	}
}

func TestUnknownCommandPrintsUsage(t *testing.T) {
	var stderr bytes.Buffer
	if code := (&labenv{getenv: func(string) string { return "" }, exists: func(string) bool { return false }, stdout: &bytes.Buffer{}, stderr: &stderr}).run(context.Background(), []string{"apply"}); code != 2 || !strings.Contains(stderr.String(), "usage") {
		t.Errorf("exit %d, stderr %q; want 2 and the usage", code, stderr.String())
	}
}

// TestMakeTargetsStopBeforeGo: `make plan|deploy|destroy` check the
// credentials in the shell before go builds anything (so a missing one
// fails at once, not after a build), with the same one line labenv's
// Preflight prints, for every combination of what is missing; with
// everything present they go on to labenv (here GO=false stands for it).
func TestMakeTargetsStopBeforeGo(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not on PATH")
	}
	home := t.TempDir()
	adc := filepath.Join(home, ".config", "gcloud", "application_default_credentials.json")
	if err := os.MkdirAll(filepath.Dir(adc), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		adc  bool
	}{
		{"nothing", map[string]string{}, false},
		{"project only", map[string]string{tfdriver.EnvProject: "p"}, false},
		{"no ADC", map[string]string{tfdriver.EnvProject: "p", tfdriver.EnvBillingAccount: "b"}, false},
		{"billing through TF_VAR, no project", map[string]string{"TF_VAR_billing_account": "b"}, true},
		{"ADC file named but absent", map[string]string{tfdriver.EnvProject: "p", tfdriver.EnvBillingAccount: "b", "GOOGLE_APPLICATION_CREDENTIALS": filepath.Join(home, "nope.json")}, true},
		{"everything", map[string]string{tfdriver.EnvProject: "p", tfdriver.EnvBillingAccount: "b"}, true},
	} {
		if tc.adc {
			if err := os.WriteFile(adc, []byte("{}"), 0o600); err != nil {
				t.Fatal(err)
			}
		} else {
			_ = os.Remove(adc)
		}
		tc.env["HOME"] = home
		getenv := func(k string) string { return tc.env[k] }
		_, perr := tfdriver.Preflight(getenv, tfdriver.FileExists)
		for _, target := range []string{"plan", "deploy", "destroy"} {
			cmd := exec.Command("make", "-s", "--no-print-directory", "-C", "../../..", target, "GO=false")
			cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
			for k, v := range tc.env {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var lines []string
			for _, l := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
				if strings.HasPrefix(l, "labenv ") {
					lines = append(lines, l)
				}
			}
			if perr == nil {
				if len(lines) != 0 {
					t.Errorf("%s, make %s: stopped with %q although nothing is missing", tc.name, target, lines)
				}
				if err == nil {
					t.Errorf("%s, make %s: succeeded with GO=false: it never reached labenv", tc.name, target)
				}
				continue
			}
			want := "labenv " + target + ": " + perr.Error()
			if len(lines) != 1 || lines[0] != want {
				t.Errorf("%s, make %s: stderr lines %q; want exactly %q", tc.name, target, lines, want)
			}
			if err == nil || stdout.Len() != 0 {
				t.Errorf("%s, make %s: err %v, stdout %q; want a failure and nothing on stdout", tc.name, target, err, stdout.String())
			}
		}
	}
}
