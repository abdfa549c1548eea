package client_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// repo is the path of the repository's module; the SDK's modules are
// nested under it.
const repo = "github.com/distributed-lock-lab/distributed-lock-lab/"

// goList runs go list in this module alone (its own go.mod, no
// workspace), as a caller's build sees it.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.Fields(string(out))
}

// TestSDKAndAPIImportOnlyTheStandardLibrary enforces the zero-dependency
// rule: a service can take the SDK without pulling in a backend.
func TestSDKAndAPIImportOnlyTheStandardLibrary(t *testing.T) {
	allowed := map[string]bool{repo + "lockserver/api": true, repo + "lockserver/client": true}
	for _, p := range goList(t, "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", repo+"lockserver/api", repo+"lockserver/client") {
		if !allowed[p] {
			t.Errorf("lockserver/api or lockserver/client depends on %s; only the standard library is allowed", p)
		}
	}
}

// TestModuleRequiresOnlyTheSDKModules: the module graph a caller's go get
// of the SDK adds (this module's go.mod, lockserver/api's, and what they
// require, tests' needs included) holds the SDK's two modules and nothing
// else.
func TestModuleRequiresOnlyTheSDKModules(t *testing.T) {
	allowed := map[string]bool{repo + "lockserver/api": true, repo + "lockserver/client": true}
	for _, m := range goList(t, "-m", "-f", "{{.Path}}", "all") {
		if !allowed[m] {
			t.Errorf("the SDK's module graph holds %s; its go.mod files may require only lockserver/api and lockserver/client", m)
		}
	}
}
