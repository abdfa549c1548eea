package literaltest_test

import (
	"go/token"
	"path/filepath"
	"reflect"
	"slices"
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

// railShapes are the JSON field sets of the rail's body types, read from
// functions/rail itself.
func railShapes() literaltest.Shapes {
	shapes := literaltest.Shapes{}
	for _, v := range []any{rail.SubmitRequest{}, rail.SubmitAnswer{}, rail.Submission{},
		rail.StopRequest{}, rail.StopAnswer{}, rail.SubmissionList{}} {
		t := reflect.TypeOf(v)
		var fields []string
		for f := range t.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			fields = append(fields, name)
		}
		shapes["rail."+t.Name()] = fields
	}
	return shapes
}

// TestOnlyTheRailPackageDefinesTheRailsBodies checks every Go file of the
// module outside functions/rail, tests included: no struct has the JSON
// fields of one of the rail's bodies. A copy keeps encoding the old body
// after the contract changes; rail-proxy, the reconciler and rail-stub use
// functions/rail's types.
func TestOnlyTheRailPackageDefinesTheRailsBodies(t *testing.T) {
	root := moduleRoot(t)
	found, files, err := literaltest.StructsInModule(root, []string{filepath.Join(root, "functions", "rail")}, railShapes())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		t.Errorf("%s; use the functions/rail type", f)
	}
	if files < 100 {
		t.Fatalf("checked only %d files under %s; the walk is broken", files, root)
	}
}

// TestRailBodiesFindsAPlantedCopy shows that the check above can fail: a
// named and an anonymous copy are reported, a body with one field more
// or less is not.
func TestRailBodiesFindsAPlantedCopy(t *testing.T) {
	src := `package p
type railRequest struct {
	PayoutID    string ` + "`json:\"payoutId\"`" + `
	AccountID   string ` + "`json:\"accountId\"`" + `
	AmountMinor int64  ` + "`json:\"amountMinor\"`" + `
	Currency    string ` + "`json:\"currency\"`" + `
	Reference   string ` + "`json:\"reference,omitempty\"`" + `
}
var stop = struct {
	Reference string ` + "`json:\"reference\"`" + `
}{"p-1"}
type answer struct {
	Status    string ` + "`json:\"status\"`" + `
	RailRef   string ` + "`json:\"railRef\"`" + `
	AttemptID int64  ` + "`json:\"attemptId\"`" + `
}
type fine struct {
	PayoutID string ` + "`json:\"payoutId\"`" + `
	Status   string ` + "`json:\"status\"`" + `
}
`
	found, err := literaltest.StructsInSource(token.NewFileSet(), "planted.go", src, railShapes())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"planted.go:2:18: struct has the JSON fields of rail.SubmitRequest",
		"planted.go:9:12: struct has the JSON fields of rail.StopRequest"}
	if !slices.Equal(found, want) {
		t.Fatalf("found %q\nwant %q", found, want)
	}
}
