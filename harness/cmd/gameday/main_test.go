package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestExtraArgumentsAreRefused: gameday takes flags only, like soak. An
// argument after the flags (a fault name without -faults, a typo) was
// silently ignored, and the whole game day ran with the defaults; now it
// is refused before anything is written. The unknown fault makes a run
// that ignored the argument fail fast too, so the test never starts a
// stack: it then sees the fault's error and a written gameday.json.
func TestExtraArgumentsAreRefused(t *testing.T) {
	out := t.TempDir()
	err := run([]string{"-out", out, "-faults", "no-such-fault", "forged-token"})
	if err == nil || !strings.Contains(err.Error(), "unexpected arguments") || !strings.Contains(err.Error(), "forged-token") {
		t.Fatalf("run with an extra argument: %v; want the unexpected arguments named", err)
	}
	entries, rerr := os.ReadDir(out)
	if rerr != nil {
		t.Fatal(rerr)
	}
	for _, e := range entries {
		t.Errorf("a refused command line wrote %s", filepath.Join(out, e.Name()))
	}
}
