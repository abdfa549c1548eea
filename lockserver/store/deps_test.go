package store_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestStoresDoNotImportTheServer keeps the arrows one way: the contract,
// the stores and their suite depend on none of lock-server's HTTP server
// and coordination (package lockserver), which imports them.
func TestStoresDoNotImportTheServer(t *testing.T) {
	const server = "github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		for _, imp := range f[1:] {
			if imp == server {
				t.Errorf("%s imports %s; stores depend on the contract (package store) only", f[0], server)
			}
		}
	}
}
