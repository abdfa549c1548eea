package pgstore

import (
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/servertest"
)

// TestAbandonedGrantsThroughLockServer: servertest.AbandonedGrants on
// PostgreSQL, half of its schedules in make test (serverHalf).
func TestAbandonedGrantsThroughLockServer(t *testing.T) {
	servertest.AbandonedGrants(t, serverHalf(backend()))
}
