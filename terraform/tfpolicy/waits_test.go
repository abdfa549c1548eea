package tfpolicy_test

import (
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/tfpolicy"
)

// closure returns every resource addr depends on, directly or not.
func closure(deps map[string][]string, addr string) map[string]bool {
	seen := map[string]bool{}
	var walk func(string)
	walk = func(a string) {
		for _, d := range deps[a] {
			if !seen[d] {
				seen[d] = true
				walk(d)
			}
		}
	}
	walk(addr)
	return seen
}

// TestEverythingWaitsForPropagation: in the real module, every resource
// after the APIs waits for time_sleep.apis, and every binding outside the
// iam module that names one of its service accounts waits for
// time_sleep.service_accounts, the propagation Google documents.
func TestEverythingWaitsForPropagation(t *testing.T) {
	c, err := tfpolicy.Load("..")
	if err != nil {
		t.Fatal(err)
	}
	deps := c.ResourceDeps()
	if _, ok := deps["time_sleep.apis"]; !ok {
		t.Fatal("the real module has no time_sleep.apis")
	}
	exempt := func(a string) bool {
		return strings.HasPrefix(a, "module.budget.") || strings.HasPrefix(a, "module.apis.") || strings.HasPrefix(a, "time_sleep.") ||
			strings.HasPrefix(a, "module.iam.") || a == "google_monitoring_alert_policy.payout_dead_lettered"
	}
	bindings := 0
	for a := range deps {
		if exempt(a) {
			continue
		}
		before := closure(deps, a)
		if !before["time_sleep.apis"] {
			t.Errorf("%s does not wait for time_sleep.apis", a)
		}
		parts := strings.Split(a, ".")
		if strings.HasSuffix(parts[len(parts)-2], "_iam_member") {
			bindings++
			if !before["time_sleep.service_accounts"] {
				t.Errorf("binding %s does not wait for time_sleep.service_accounts", a)
			}
		}
	}
	if bindings == 0 {
		t.Error("no binding found outside module.iam: the walk is wrong")
	}
}
