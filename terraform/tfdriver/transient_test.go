package tfdriver_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/terraform/tfdriver"
)

// TestTransientErrors: the google provider's answers Google documents as
// passing by themselves are retried, as terraform prints them (wrapped
// to its width); an answer that will not change is not.
func TestTransientErrors(t *testing.T) {
	step := func(diag string) error {
		return fmt.Errorf("%w: apply: exit status 1\n%s", tfdriver.ErrStep, diag)
	}
	for _, tc := range []struct {
		diag string
		want bool
	}{
		{"Error: Error creating Secret: googleapi: Error 403: Secret Manager API has not been used in project 123 before or it is\ndisabled. Enable it by visiting ...\nDetails: reason SERVICE_DISABLED", true},
		{"Error: Error applying IAM policy: googleapi: Error 400: Service account\ndlock-executor@lab-1.iam.gserviceaccount.com does not exist., badRequest", true},
		{"Error: googleapi: Error 409: There were concurrent policy changes. Please retry the whole read-modify-write with exponential backoff., aborted", true},
		{"Error: googleapi: Error 429: Quota exceeded for quota metric 'Write requests', rateLimitExceeded", true},
		{"Error: googleapi: Error 503: The service is currently unavailable., backendError", true},
		{"Error: googleapi: Error 409: Requested entity already exists, alreadyExists", false},
		{"Error: googleapi: Error 400: Invalid value for field 'resource.tier', invalid", false},
		{"Error: googleapi: Error 403: Permission 'iam.serviceAccounts.create' denied on resource, forbidden", false},
	} {
		if _, got := tfdriver.Transient(step(tc.diag)); got != tc.want {
			t.Errorf("Transient(%q) = %v, want %v", tc.diag, got, tc.want)
		}
	}
	if _, got := tfdriver.Transient(errors.New("Error 503: not from a terraform step")); got {
		t.Error("Transient of an error that is not a failed step = true, want false")
	}
}
