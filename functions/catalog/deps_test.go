package catalog_test

import (
	"os/exec"
	"strings"
	"testing"
)

const mod = "github.com/distributed-lock-lab/distributed-lock-lab"

// railStubHosts are the binaries that serve rail-stub, so link railstub:
// its own main, and the functions-framework binary and root package,
// which register every function (rail-stub is deployed as one).
var railStubHosts = map[string]bool{
	mod + "/functions/cmd/rail-stub": true,
	mod + "/functions/cmd/framework": true,
	mod:                              true,
}

// TestProductionBinariesLinkNoTestHelper: no deployed binary links a test
// helper (a package whose name ends in "test", or functions/pipelinetest),
// and only the binaries that serve rail-stub link railstub.
func TestProductionBinariesLinkNoTestHelper(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}",
		mod+"/functions/cmd/...", mod+"/lockserver/cmd/...", mod).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	bins := strings.Fields(string(out))
	if len(bins) < 8 {
		t.Fatalf("found only %d binaries: %v", len(bins), bins)
	}
	for _, bin := range bins {
		deps, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", bin).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", bin, err, deps)
		}
		for _, p := range strings.Fields(string(deps)) {
			if !strings.HasPrefix(p, mod+"/") {
				continue
			}
			switch {
			case strings.HasSuffix(p, "test"):
				t.Errorf("%s links the test helper %s", bin, p)
			case p == mod+"/functions/railstub" && !railStubHosts[bin]:
				t.Errorf("%s links rail-stub (functions/railstub); a rail client needs only functions/rail", bin)
			}
		}
	}
}

// TestReconcilerDoesNotLinkPaymentResource: the reconciler audits paydb
// through the read-only functions/paymentresource/ledgeraudit, not the
// payment-resource service.
func TestReconcilerDoesNotLinkPaymentResource(t *testing.T) {
	deps, err := exec.Command("go", "list", "-deps", mod+"/functions/cmd/reconciler").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, deps)
	}
	for _, p := range strings.Fields(string(deps)) {
		if p == mod+"/functions/paymentresource" {
			t.Errorf("functions/cmd/reconciler links %s", p)
		}
	}
}
