package rail_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestWirePackagesImportOnlyTheStandardLibrary: the rail's contract and
// the fencing vocabulary are wire packages; any caller takes them without
// a dependency.
func TestWirePackagesImportOnlyTheStandardLibrary(t *testing.T) {
	const mod = "github.com/distributed-lock-lab/distributed-lock-lab/"
	wire := []string{mod + "functions/rail", mod + "functions/fencing/fencewire"}
	out, err := exec.Command("go", append([]string{"list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}"}, wire...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if p != wire[0] && p != wire[1] {
			t.Errorf("a wire package (functions/rail, functions/fencing/fencewire) depends on %s; only the standard library is allowed", p)
		}
	}
}
