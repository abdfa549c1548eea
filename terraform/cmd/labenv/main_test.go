package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestEveryCommandStopsAtOnceWithoutCredentials(t *testing.T) {
	for _, cmd := range []string{"plan", "deploy", "destroy"} {
		var stdout, stderr bytes.Buffer
		dir := t.TempDir() // no module: reaching terraform would fail differently
		code := run(context.Background(), []string{"-dir", dir, cmd}, func(string) string { return "" }, func(string) bool { return false }, &stdout, &stderr)
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
	if code := run(context.Background(), []string{"apply"}, func(string) string { return "" }, func(string) bool { return false }, &bytes.Buffer{}, &stderr); code != 2 || !strings.Contains(stderr.String(), "usage") {
		t.Errorf("exit %d, stderr %q; want 2 and the usage", code, stderr.String())
	}
}
