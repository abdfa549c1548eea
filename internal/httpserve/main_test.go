package httpserve_test

import (
	"testing"

	"go.uber.org/goleak"
)

// No goroutine outlives the tests: Serve's goroutines end when it returns.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
