package api_test

import (
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/literaltest"
)

// genericCodes are codes payment-resource shares with every JSON service of
// the project (lock-server's api, internal/jsonhandler, rail-stub, the
// executor's own answers); each of those spells them for itself, so they
// cannot be told apart from a copy of payment-resource's.
var genericCodes = map[api.Code]bool{
	api.CodeInvalidRequest: true, api.CodeBodyTooLarge: true, api.CodeUnsupportedMediaType: true,
	api.CodeNotFound: true, api.CodeMethodNotAllowed: true, api.CodeInternal: true,
	api.CodeOverloaded:       true, // lock-server's and rail-proxy's too
	api.CodeRequestCancelled: true, // lock-server's and rail-proxy's too, with the same status
}

// contractPatterns returns, for each spelling of payment-resource's
// contract that only the api package may write as a literal, a pattern
// matching it inside a string literal: its own codes, its route
// prefixes and its environment variable names.
func contractPatterns() literaltest.Patterns {
	pats := literaltest.Patterns{}
	for _, c := range api.Codes {
		if !genericCodes[c] {
			pats[string(c)] = literaltest.Word(string(c))
		}
	}
	for _, p := range []string{api.PathAccounts, api.PathPayouts, api.PathAudit} {
		pats[p] = literaltest.Path(p)
	}
	for _, e := range []string{api.EnvDatabaseURL, api.EnvCloudSQLInstance, api.EnvMaxConns, api.EnvFencingEnabled, api.EnvOutboxPollMs,
		api.EnvMaxInFlight, api.EnvStallProbeMs, api.EnvStallAfterMs} {
		pats[e] = literaltest.Word(e)
	}
	return pats
}

// TestOnlyTheAPISpellsPaymentResourcesContract checks every non-test Go
// file of the module outside this package: none may spell one of
// payment-resource's own error codes, route paths or environment variable
// names as a string literal; they use the api constants instead, so that
// the contract has one spelling. FENCED_OUT is spelled once more, in
// functions/payoutevent, which both fence points share.
func TestOnlyTheAPISpellsPaymentResourcesContract(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found at %s: %v", root, err)
	}
	self, _ := filepath.Abs(".")
	found, files, err := literaltest.InModule(root, []string{self},
		[]string{filepath.Join(root, "functions", "fencing", "fencewire", "fencewire.go")}, contractPatterns())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		t.Errorf("%s; use the functions/paymentresource/api constant", f)
	}
	if files < 50 {
		t.Fatalf("checked only %d files under %s; the walk is broken", files, root)
	}
}

// TestContractLiteralsFindsAPlantedCopy shows that the check above can
// fail: a planted code, path and variable name are each reported, and the
// constants and generic codes are not.
func TestContractLiteralsFindsAPlantedCopy(t *testing.T) {
	src := `package p
const a = "PAYOUT_FINISHED"
var b = base + "/v1/payouts/" + id + "/claim"
var c = "PAYDB_URL=" + dsn
var d = "409 ` + fencewire.CodeFencedOut + `"
var fine = []string{"PAYOUT_ALREADY_SUBMITTED", "NOT_FOUND", "INVALID_REQUEST", "/v1/payoutsx", "/v1/rail/submissions"}
`
	found, err := literaltest.InSource(token.NewFileSet(), "planted.go", src, contractPatterns())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"spells PAYOUT_FINISHED", "spells /v1/payouts", "spells PAYDB_URL", "spells FENCED_OUT"}
	if len(found) != len(want) {
		t.Fatalf("found %d literals, want %d: %q", len(found), len(want), found)
	}
	for _, w := range want {
		ok := false
		for _, f := range found {
			ok = ok || strings.HasSuffix(f, w)
		}
		if !ok {
			t.Errorf("planted literal that %s not reported; found %q", w, found)
		}
	}
}
