package pgstore

import (
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/servertest"
)

// TestAbandonedGrantsThroughLockServer: servertest.AbandonedGrants on
// PostgreSQL.
func TestAbandonedGrantsThroughLockServer(t *testing.T) { servertest.AbandonedGrants(t, backend()) }
