package pgcluster

import (
	"testing"

	"go.uber.org/goleak"
)

// No goroutine outlives the tests: every postmaster's waiter goroutine ends when its cluster is closed.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
