package client_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestSDKAndAPIImportOnlyTheStandardLibrary enforces the zero-dependency
// rule: a service can take the SDK without pulling in a backend.
func TestSDKAndAPIImportOnlyTheStandardLibrary(t *testing.T) {
	const mod = "github.com/distributed-lock-lab/distributed-lock-lab/"
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}",
		mod+"lockserver/api", mod+"lockserver/client").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	allowed := map[string]bool{mod + "lockserver/api": true, mod + "lockserver/client": true}
	for _, p := range strings.Fields(string(out)) {
		if !allowed[p] {
			t.Errorf("lockserver/api or lockserver/client depends on %s; only the standard library is allowed", p)
		}
	}
}
