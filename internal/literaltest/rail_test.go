package literaltest_test

import (
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/literaltest"
)

// railPatterns are the rail's own error codes and routes (package
// functions/rail). NOT_FOUND, METHOD_NOT_ALLOWED and INTERNAL are every
// service's, so they are not the rail's to own.
func railPatterns() literaltest.Patterns {
	pats := literaltest.Patterns{}
	for _, c := range []string{rail.CodeUnavailable, rail.CodeJournalFailed, rail.CodeStubClosed, rail.CodeReferenceStopped} {
		pats[c] = literaltest.Word(c)
	}
	for _, p := range []string{rail.PathSubmit, rail.PathStops, rail.PathJournal} {
		pats[p] = literaltest.Route(p)
	}
	return pats
}

// TestOnlyTheRailPackageSpellsTheRailsContract checks every non-test Go
// file of the module outside functions/rail: none spells one of the rail's
// codes or routes as a string literal. rail-proxy's api is left out: its
// own route /v1/rail/submissions is written as a prefix and "/submissions".
func TestOnlyTheRailPackageSpellsTheRailsContract(t *testing.T) {
	root := moduleRoot(t)
	found, files, err := literaltest.InModule(root,
		[]string{filepath.Join(root, "functions", "rail")},
		[]string{filepath.Join(root, "functions", "railproxy", "api", "api.go")}, railPatterns())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		t.Errorf("%s; use the functions/rail constant", f)
	}
	if files < 50 {
		t.Fatalf("checked only %d files under %s; the walk is broken", files, root)
	}
}

// TestRailsContractIsSpelledByConstantInTests checks the test files of every
// package but functions/rail the same way: a test that spells "/submit"
// keeps passing against a stub that still serves it after the contract
// moved, so it tests a copy, not the contract. functions/rail's own tests
// are left out: they are where a test may pin the wire bytes themselves
// (the constant's value against the spelling other parties rely on).
func TestRailsContractIsSpelledByConstantInTests(t *testing.T) {
	root := moduleRoot(t)
	self, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	found, files, err := literaltest.InModuleTests(root,
		[]string{filepath.Join(root, "functions", "rail")},
		// The planted sources of this check and of rail-proxy's api check.
		[]string{filepath.Join(self, "rail_test.go"), filepath.Join(root, "functions", "railproxy", "api", "literals_test.go")},
		railPatterns())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		t.Errorf("%s; use the functions/rail constant", f)
	}
	if files < 50 {
		t.Fatalf("checked only %d test files under %s; the walk is broken", files, root)
	}
}

// TestRailLiteralsFindsAPlantedCopy shows that the check above can fail:
// each planted code and route is reported, and rail-proxy's routes and
// look-alikes are not.
func TestRailLiteralsFindsAPlantedCopy(t *testing.T) {
	src := `package p
var a = base + "/submit"
var b = stub + "/submissions?payoutId=" + id
var c = []string{"POST", "/stops"}
var d = "503 RAIL_UNAVAILABLE"
var e = "JOURNAL_FAILED"
var f = "STUB_CLOSED"
var g = "REFERENCE_STOPPED"
var fine = []string{"/v1/rail/submissions", "/submits", "/stopsx", "RAIL_UNAVAILABLE_X", "NOT_FOUND", "INTERNAL", "submit"}
`
	found, err := literaltest.InSource(token.NewFileSet(), "planted.go", src, railPatterns())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"spells /submit", "spells /submissions", "spells /stops", "spells RAIL_UNAVAILABLE",
		"spells JOURNAL_FAILED", "spells STUB_CLOSED", "spells REFERENCE_STOPPED"}
	if len(found) != len(want) {
		t.Fatalf("found %d literals, want %d: %q", len(found), len(want), found)
	}
	for i, w := range want {
		if !strings.HasSuffix(found[i], w) {
			t.Errorf("finding %d = %q; want it to end %q", i, found[i], w)
		}
	}
}
