package etcdstore

import (
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/servertest"
)

// TestAbandonedGrantsThroughLockServer: servertest.AbandonedGrants on
// etcd, half of its schedules in make test (serverHalf).
func TestAbandonedGrantsThroughLockServer(t *testing.T) {
	servertest.AbandonedGrants(t, serverHalf(backend(t)))
}
