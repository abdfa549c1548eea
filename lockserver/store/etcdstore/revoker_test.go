package etcdstore

import (
	"strconv"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
)

// TestEndedGrantsLeasesAreRevokedTogether: the leases of ended grants
// (released, force-revoked, handed off) wait for the revoker's window,
// alive and carrying nothing, and are then revoked in one batch. The
// window is a channel the test fires.
func TestEndedGrantsLeasesAreRevokedTogether(t *testing.T) {
	s := openCfgT(t, nil)
	tick := make(chan time.Time)
	s.revokeWait = func() <-chan time.Time { return tick }
	const n = 5
	var ids []string
	for i := range n {
		key := "payout:acct-" + strconv.Itoa(i)
		l := mustAcquire(t, s, key, "worker-a", 5*time.Second)
		switch i % 3 {
		case 0:
			if err := s.Release(ctxT(t), key, "worker-a", l.Token); err != nil {
				t.Fatalf("Release: %v", err)
			}
		case 1:
			if _, err := s.Revoke(ctxT(t), key, l.Token); err != nil {
				t.Fatalf("Revoke: %v", err)
			}
		case 2:
			b, err := s.Handoff(ctxT(t), lockserver.LeaseRef{Key: key, Owner: "worker-a", Token: l.Token}, lockserver.AcquireRequest{Key: key, Owner: "worker-b", TTL: 5 * time.Second})
			if err != nil {
				t.Fatalf("Handoff: %v", err)
			}
			if err := s.Release(ctxT(t), key, "worker-b", b.Token); err != nil {
				t.Fatalf("Release after the handoff: %v", err)
			}
			ids = append(ids, b.LeaseID)
		}
		ids = append(ids, l.LeaseID)
	}
	for _, id := range ids {
		if !leaseAlive(t, s, id) {
			t.Fatalf("lease %s revoked before the revoker's window passed; want it queued with the others", id)
		}
	}
	tick <- time.Time{}
	s.bg.Wait()
	for _, id := range ids {
		if leaseAlive(t, s, id) {
			t.Errorf("lease %s alive after the revoker's batch", id)
		}
	}
	if st := s.LeaseStats(); st.Revoked != uint64(len(ids)) || st.RevokeBatches != 1 {
		t.Errorf("LeaseStats %+v; want %d leases revoked in 1 batch", st, len(ids))
	}
}

// TestCloseRevokesTheQueuedLeasesAtOnce: Close does not wait for the
// revoker's window; it has the queued leases revoked, and returns.
func TestCloseRevokesTheQueuedLeasesAtOnce(t *testing.T) {
	// Not openCfgT: its cleanup would Close again, and wait with a
	// Close that hangs.
	s, err := Open(ctxT(t), conf(func(c *Config) { c.Endpoints, c.Prefix = shared.Endpoints(), newPrefix(t) }), nil)
	if err != nil {
		t.Fatal(err)
	}
	s.revokeWait = func() <-chan time.Time { return nil } // a window that never passes
	l := mustAcquire(t, s, "payout:acct-close", "worker-a", 5*time.Second)
	if err := s.Release(ctxT(t), "payout:acct-close", "worker-a", l.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close still waiting for the revoker's window after 30 s")
	}
	if st := s.LeaseStats(); st.Revoked != 1 || st.RevokeBatches != 1 {
		t.Errorf("LeaseStats after Close %+v; want the queued lease revoked in 1 batch", st)
	}
}
