package executor_test

import (
	"testing"

	"go.uber.org/goleak"
)

// No goroutine outlives the tests: the leases' renewal goroutines end with their release, and Close stops the rest.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// A dependency of the Google auth libraries (Cloud Run ID tokens)
		// links OpenCensus, whose view worker starts once per process and never stops.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"))
}
