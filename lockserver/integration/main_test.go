package integration_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Leases renew and watch their deadlines in goroutines: every test must
// leave none behind (released, lost or cancelled leases stop theirs).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
