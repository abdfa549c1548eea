package etcdstore

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The revoker: revocations of emptied leases, sent together.
//
// A grant ends by a conditional delete of its key (Release, Revoke) or a
// transaction that moves the key to the next holder's lease (Handoff).
// Either leaves the grant's lease carrying nothing, and it is revoked
// afterwards, off the request's path. A revocation is a raft write of
// its own (etcd has no revocation of many leases in one request), and
// one sent at once for every ended grant meets the next grant's
// transaction at the disk: on a 2-vCPU machine a lone client's acquire
// and release pair cost about as much as when the release itself waited
// for the revocation. So the emptied leases wait up to revokeWindow for
// others, and the revoker then sends their revocations together, at most
// maxRevokeBatch at a time: concurrent proposals share etcd's raft write
// to disk, as the granter's batches of idle leases do (pool.go).
//
// Waiting costs nothing but the lease's presence: it carries no key, no
// grant can be attached to it again (a lease carries one grant in its
// whole life), and a revocation that fails or never comes (the store
// closed, the process died) leaves it to expire after its TTL.

const (
	// revokeWindow is how long an emptied lease waits for others before
	// the revoker revokes the batch.
	revokeWindow = 50 * time.Millisecond
	// maxRevokeBatch caps the revocations in flight at once.
	maxRevokeBatch = 256
)

// emptied is a lease whose grant has ended, waiting for its revocation;
// key is the lock it carried, for the log.
type emptied struct {
	key string
	id  clientv3.LeaseID
}

// revokeLater queues lease id, which carries no key any more, for the
// revoker, and starts the revoker if it is not running. Best effort: a
// lease queued after Close began is left to expire after its TTL.
func (s *Store) revokeLater(key string, id clientv3.LeaseID) {
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	if s.closing {
		return
	}
	s.toRevoke = append(s.toRevoke, emptied{key: key, id: id})
	if !s.revoking {
		s.revoking = true
		s.bg.Go(s.revoker)
	}
}

// revoker revokes the queued leases in batches, each after revokeWindow
// (s.revokeWait; at once when Close has begun), until none is queued;
// then it ends. Close waits for it.
func (s *Store) revoker() {
	for {
		select {
		case <-s.revokeWait():
		case <-s.flush:
		}
		s.bgMu.Lock()
		n := min(len(s.toRevoke), maxRevokeBatch)
		batch := s.toRevoke[:n:n]
		s.toRevoke = s.toRevoke[n:]
		s.bgMu.Unlock()
		var sent sync.WaitGroup
		for _, e := range batch {
			sent.Go(func() {
				if s.revokeBestEffort(context.Background(), e.key, e.id) {
					s.revoked.Add(1)
				}
			})
		}
		sent.Wait()
		s.revokeBatches.Add(1)
		s.bgMu.Lock()
		if len(s.toRevoke) == 0 {
			s.toRevoke, s.revoking = nil, false
			s.bgMu.Unlock()
			return
		}
		s.bgMu.Unlock()
	}
}

// afterRevokeWindow is Store.revokeWait outside tests.
func afterRevokeWindow() <-chan time.Time { return time.After(revokeWindow) }
