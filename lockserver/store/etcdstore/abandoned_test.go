package etcdstore

import (
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/servertest"
)

// TestAbandonedGrantsThroughLockServer: servertest.AbandonedGrants on etcd.
func TestAbandonedGrantsThroughLockServer(t *testing.T) { servertest.AbandonedGrants(t, backend(t)) }
