package api_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestAPIAndClientImportOnlyTheStandardLibrary enforces the dependency
// rule of the contract: rail-proxy's api package and its client import
// only the standard library, the pipeline's wire packages
// functions/payoutevent and functions/fencing/fencewire, the rail's
// contract functions/rail (whose status values rail-proxy relays) and (the client) the stdlib-only transport core
// internal/jsonclient with the envelope's home internal/jsonhandler, so that a caller never pulls in a database driver.
func TestAPIAndClientImportOnlyTheStandardLibrary(t *testing.T) {
	const mod = "github.com/distributed-lock-lab/distributed-lock-lab/"
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}",
		mod+"functions/railproxy/api", mod+"functions/railproxy/client").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	allowed := map[string]bool{
		mod + "functions/railproxy/api":     true,
		mod + "functions/railproxy/client":  true,
		mod + "functions/payoutevent":       true,
		mod + "functions/fencing/fencewire": true,
		mod + "functions/rail":              true,
		mod + "internal/jsonclient":         true, // the clients' stdlib-only transport core
		mod + "internal/jsonhandler":        true, // the error envelope jsonclient decodes
	}
	for _, p := range strings.Fields(string(out)) {
		if !allowed[p] {
			t.Errorf("functions/railproxy/api or its client depends on %s; only the standard library, functions/payoutevent, functions/fencing/fencewire, functions/rail, internal/jsonclient and internal/jsonhandler are allowed", p)
		}
	}
}
