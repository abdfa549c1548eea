package tfdriver_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/tfdriver"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestPreflightNamesEverythingMissingOnOneLine(t *testing.T) {
	_, err := tfdriver.Preflight(env(map[string]string{"HOME": "/home/x"}), func(string) bool { return false })
	if !errors.Is(err, tfdriver.ErrMissingCredentials) {
		t.Fatalf("Preflight = %v, want ErrMissingCredentials", err)
	}
	msg := err.Error()
	for _, want := range []string{"GOOGLE_CLOUD_PROJECT", "BILLING_ACCOUNT", "gcloud auth application-default login"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not name %s", msg, want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("message %q is more than one line", msg)
	}
}

func TestPreflightPassesWithProjectBillingAndADC(t *testing.T) {
	adc := "/home/x/.config/gcloud/application_default_credentials.json"
	v, err := tfdriver.Preflight(env(map[string]string{
		"HOME": "/home/x", "GOOGLE_CLOUD_PROJECT": "lab-1", "TF_VAR_billing_account": "000000-000000-000000",
	}), func(p string) bool { return p == adc })
	if err != nil {
		t.Fatalf("Preflight = %v, want nil", err)
	}
	if m := v.Map(); m["project_id"] != "lab-1" || m["billing_account"] != "000000-000000-000000" || len(m) != 2 {
		t.Errorf("vars = %v", m)
	}
	// Only the credentials missing: the line names only them.
	_, err = tfdriver.Preflight(env(map[string]string{
		"GOOGLE_CLOUD_PROJECT": "lab-1", "BILLING_ACCOUNT": "b", "GOOGLE_APPLICATION_CREDENTIALS": "/nope.json",
	}), func(string) bool { return false })
	if err == nil || strings.Contains(err.Error(), "GOOGLE_CLOUD_PROJECT") || !strings.Contains(err.Error(), "Application Default Credentials") {
		t.Errorf("Preflight with a missing key file = %v, want only the credentials named", err)
	}
}
