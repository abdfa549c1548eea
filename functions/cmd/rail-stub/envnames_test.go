package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/catalog/railstubfn"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/envcheck"
)

// TestMisspeltVariableIsWarnedAbout: with rail-stub's list of known
// variables, a misspelt railstub.EnvLatencyMs in the environment gets one
// config_unknown_variable WARN line naming it and suggesting the real name
// (serve's TestRunWarnsAboutUnknownVariables shows Main logs them at
// start), and every variable its config reads is known.
func TestMisspeltVariableIsWarnedAbout(t *testing.T) {
	good := railstub.EnvLatencyMs
	typo := "RAIL_STUB_LATENCY"
	var buf bytes.Buffer
	found := envcheck.Warn(slog.New(slog.NewJSONHandler(&buf, nil)), railstubfn.Function.EnvNames(), []string{typo + "=x", good + "=y", "HOME=/root"})
	if len(found) != 1 || found[0].Name != typo || found[0].Suggestion != good {
		t.Fatalf("unknown variables %+v; want only %s, suggesting %s", found, typo, good)
	}
	if out := buf.String(); !strings.Contains(out, `"variable":"`+typo+`"`) || !strings.Contains(out, `"didYouMean":"`+good+`"`) {
		t.Errorf("log %s; want a line naming %s and %s", out, typo, good)
	}
	var environ []string
	for _, n := range railstubfn.Function.EnvNames() {
		environ = append(environ, n+"=1")
	}
	if found := envcheck.Find(railstubfn.Function.EnvNames(), environ); len(found) != 0 {
		t.Errorf("known variables reported as unknown: %+v", found)
	}
}
