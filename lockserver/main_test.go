package lockserver_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The Server starts no goroutine of its own; requests it held (the
// overload tests) must all have ended.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
