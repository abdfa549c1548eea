package literaltest_test

import (
	"os/exec"
	"path"
	"slices"
	"strings"
	"testing"
)

// The module's test helpers are its packages whose name ends in "test"
// (pgtest, logtest, fuzztest, storetest, pipelinetest, ...), as in the
// standard library's httptest, and the correctness harness (harness/...).
// Only they may import "testing" outside test files, and no production
// program may link them. The production programs are every main package
// outside harness/ (functions/cmd/*, lockserver/cmd/*, local/cmd/*,
// terraform/cmd/*, etcd/cmd/*, ops/cmd/*, ...) and the module's root
// package, which Google's buildpack builds for Cloud Run functions;
// harness/cmd/* are harness programs and may link test helpers. Only the
// programs that serve rail-stub link the stub (functions/railstub); a rail
// client needs only functions/rail.

// railStubHosts are the programs that serve rail-stub: its own main, the
// functions-framework binary and root package, which register every
// function (rail-stub is deployed as one), and the local stack's program.
var railStubHosts = map[string]bool{"functions/cmd/rail-stub": true, "functions/cmd/framework": true, "": true, "local": true}

// goList runs go list with args in the module's root and returns its
// output lines.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = moduleRoot(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v", args, err)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// testHelper reports whether the module's package rel (its path inside
// the module) is a test helper.
func testHelper(rel string) bool {
	return strings.HasSuffix(path.Base(rel), "test") || rel == "harness" || strings.HasPrefix(rel, "harness/")
}

// TestOnlyTestHelpersImportTesting: outside test files, a package that
// imports "testing" is a test helper by name.
func TestOnlyTestHelpersImportTesting(t *testing.T) {
	mod := goList(t, "-m")[0] + "/"
	for _, line := range goList(t, "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", "./...") {
		f := strings.Fields(line)
		rel := strings.TrimPrefix(f[0], mod)
		if slices.Contains(f[1:], "testing") && !testHelper(rel) {
			t.Errorf("%s imports testing outside its test files: name it ...test (a test helper) or drop the import", rel)
		}
	}
}

// TestNoProductionProgramLinksATestHelper follows the imports of every
// production program and reports each test helper it reaches, with the
// package that imports it.
func TestNoProductionProgramLinksATestHelper(t *testing.T) {
	mod := goList(t, "-m")[0]
	var programs []string
	for _, line := range goList(t, "-f", "{{.Name}} {{.ImportPath}}", "./...") {
		name, p, _ := strings.Cut(line, " ")
		if p == mod || name == "main" && !testHelper(strings.TrimPrefix(p, mod+"/")) {
			programs = append(programs, p)
		}
	}
	if len(programs) < 10 || !slices.Contains(programs, mod+"/functions/cmd/executor") {
		t.Fatalf("production programs %v: the list is wrong, so the check would prove nothing", programs)
	}
	imports := map[string][]string{}
	for _, line := range goList(t, append([]string{"-deps", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}"}, programs...)...) {
		f := strings.Fields(line)
		imports[f[0]] = f[1:]
	}
	for _, prog := range programs {
		seen := map[string]bool{prog: true}
		for queue := []string{prog}; len(queue) > 0; queue = queue[1:] {
			from := queue[0]
			for _, p := range imports[from] {
				if seen[p] {
					continue
				}
				seen[p] = true
				queue = append(queue, p)
				rel, ok := strings.CutPrefix(p, mod+"/")
				switch {
				case !ok:
				case testHelper(rel):
					t.Errorf("production program %s links test helper %s (imported by %s)", strings.TrimPrefix(prog, mod+"/"), rel, strings.TrimPrefix(from, mod+"/"))
				case rel == "functions/railstub" && !railStubHosts[strings.TrimPrefix(strings.TrimPrefix(prog, mod), "/")]:
					t.Errorf("production program %s links rail-stub (functions/railstub, imported by %s); a rail client needs only functions/rail", strings.TrimPrefix(prog, mod+"/"), strings.TrimPrefix(from, mod+"/"))
				case rel == "functions/paymentresource" && prog == mod+"/functions/cmd/reconciler":
					t.Errorf("the reconciler links the payment-resource service (imported by %s); it audits paydb through functions/paymentresource/ledgeraudit", strings.TrimPrefix(from, mod+"/"))
				}
			}
		}
	}
}
