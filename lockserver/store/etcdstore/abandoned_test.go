package etcdstore

import (
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/storetest"
)

// TestAbandonedGrantsThroughLockServer: storetest.AbandonedGrants on etcd.
func TestAbandonedGrantsThroughLockServer(t *testing.T) { storetest.AbandonedGrants(t, backend(t)) }
