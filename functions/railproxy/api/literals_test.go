package api_test

import (
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/literaltest"
)

// genericCodes are codes rail-proxy shares with every JSON service of the
// project (lock-server's api, internal/jsonhandler, rail-stub,
// payment-resource); each of those spells them for itself, so they cannot
// be told apart from a copy of rail-proxy's.
var genericCodes = map[api.Code]bool{
	api.CodeInvalidRequest: true, api.CodeBodyTooLarge: true, api.CodeUnsupportedMediaType: true,
	api.CodeNotFound: true, api.CodeMethodNotAllowed: true, api.CodeInternal: true,
	api.CodeOverloaded:       true, // lock-server's and payment-resource's too
	api.CodeRequestCancelled: true, // lock-server's and payment-resource's too, with the same status
}

// contractPatterns returns, for each spelling of rail-proxy's contract that
// only the api package may write as a literal, a pattern matching it inside
// a string literal: its own codes, its route prefix, its environment
// variable names and its own header (the terms signature's).
func contractPatterns() literaltest.Patterns {
	pats := literaltest.Patterns{}
	for _, c := range api.Codes {
		if !genericCodes[c] {
			pats[string(c)] = literaltest.Word(string(c))
		}
	}
	// Every route of rail-proxy is under /v1/rail/.
	for _, p := range []string{api.PathSubmissions, api.PathAttempts, strings.TrimSuffix(api.HighWaterPath(""), "/")} {
		pats[p] = literaltest.Path(p)
	}
	for _, e := range []string{api.EnvDatabaseURL, api.EnvDatabaseInstance, api.EnvRailURL, api.EnvRailTimeoutMs,
		api.EnvDBTimeoutMs, api.EnvFencingEnabled, api.EnvMaxInFlight, api.EnvStallProbeMs, api.EnvStallAfterMs, api.EnvTermsRequired} {
		pats[e] = literaltest.Word(e)
	}
	// Header names are case-insensitive on the wire: any spelling counts.
	pats[api.HeaderTermsSignature] = regexp.MustCompile(`(?i)(^|[^A-Za-z0-9_-])` + regexp.QuoteMeta(api.HeaderTermsSignature) + `($|[^A-Za-z0-9_-])`)
	return pats
}

// TestOnlyTheAPISpellsRailProxysContract checks every non-test Go file of
// the module outside this package: none may spell one of rail-proxy's own
// error codes, route paths or environment variable names as a string
// literal; they use the api constants instead, so that the contract has
// one spelling. FENCED_OUT is spelled once more, in functions/fencing/fencewire,
// which both fence points share.
func TestOnlyTheAPISpellsRailProxysContract(t *testing.T) {
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
		t.Errorf("%s; use the functions/railproxy/api constant", f)
	}
	if files < 50 {
		t.Fatalf("checked only %d files under %s; the walk is broken", files, root)
	}
}

// TestContractLiteralsFindsAPlantedCopy shows that the check above can
// fail: each planted code, path and variable name is reported, and the
// generic codes, payment-resource's codes and look-alikes are not.
func TestContractLiteralsFindsAPlantedCopy(t *testing.T) {
	src := `package p
const a = "RAIL_AMBIGUOUS"
const b = "PAYOUT_ALREADY_SUBMITTED"
const c = "503 UNAVAILABLE"
const d = "RAILDB_RESTORED"
var e = base + "/v1/rail/submissions"
var f = base + "/v1/rail/high-water/" + acct
var g = "/v1/rail/attempts?payoutId=" + id
var h = []string{"RAILDB_URL=" + dsn, "RAIL_URL=x", "RAIL_PROXY_FENCING_ENABLED=false"}
var i = "409 ` + fencewire.CodeFencedOut + `"
var j = map[string][]string{"X-Payout-Terms-Signature": {sig}}
var k = "x-payout-terms-signature: " + sig
var l = "TERMS_KEY_UNKNOWN"
var m = "RAIL_PROXY_TERMS_REQUIRED=false"
var fine = []string{"X-Payout-Terms-Signature-V2", "termsSignature", "DATABASE_UNAVAILABLE", "RAIL_UNAVAILABLE", "RAIL_PROXY_URL", "NOT_FOUND", "INTERNAL", "/v1/railx", "/v1/payouts", "/submit"}
`
	found, err := literaltest.InSource(token.NewFileSet(), "planted.go", src, contractPatterns())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"spells RAIL_AMBIGUOUS", "spells PAYOUT_ALREADY_SUBMITTED", "spells UNAVAILABLE", "spells RAILDB_RESTORED",
		"spells /v1/rail/submissions", "spells /v1/rail/high-water", "spells /v1/rail/attempts",
		"spells RAILDB_URL", "spells RAIL_URL", "spells RAIL_PROXY_FENCING_ENABLED", "spells FENCED_OUT",
		"spells X-Payout-Terms-Signature", "spells X-Payout-Terms-Signature", "spells TERMS_KEY_UNKNOWN", "spells RAIL_PROXY_TERMS_REQUIRED"}
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
