package pgstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgcluster"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// newReplicatedLockdb starts a primary with database "lockdb" and a
// streaming standby "standby1" of it (synchronous when sync), and returns
// both with the multi-host DSN that finds whichever accepts writes.
func newReplicatedLockdb(t *testing.T, sync bool) (primary, standby *pgcluster.Cluster, dsn string) {
	t.Helper()
	// Three clusters' worth of start-up (initdb, base backup) can take
	// more than testCtx's minute on a busy machine.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	primary, err := pgcluster.Start(ctx, pgcluster.Config{})
	if err != nil {
		t.Fatalf("start primary: %v", err)
	}
	pgtest.Cleanup(t, primary.Close)
	if err := primary.CreateDatabase(ctx, "lockdb"); err != nil {
		t.Fatalf("CreateDatabase: %v", err)
	}
	// The schema (and its identity stamp) before the copy, as on a
	// standby attached to a lockdb in service.
	if err := Migrate(ctx, primary.DSN("lockdb")); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	standby, err = primary.StartStandby(ctx, pgcluster.StandbyConfig{Name: "standby1"})
	if err != nil {
		t.Fatalf("StartStandby: %v", err)
	}
	pgtest.Cleanup(t, standby.Close)
	if sync {
		if err := primary.SetSynchronousStandby(ctx, "standby1"); err != nil {
			t.Fatalf("SetSynchronousStandby: %v", err)
		}
	}
	return primary, standby, pgcluster.MultiHostDSN("lockdb", primary, standby)
}

func openPromotionStore(t *testing.T, dsn string, accept bool, lines *logLines) *Store {
	t.Helper()
	s, err := Open(testCtx(t), conf(func(c *Config) {
		c.DSN, c.AcceptPromotion, c.ReplicationCheckInterval = dsn, accept, 100*time.Millisecond
	}), lines.logger())
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// failover kills the primary (SIGKILL, every process) and promotes the
// standby.
func failover(t *testing.T, primary, standby *pgcluster.Cluster) {
	t.Helper()
	if err := primary.Kill(); err != nil {
		t.Fatalf("Kill primary: %v", err)
	}
	if err := standby.Promote(testCtx(t)); err != nil {
		t.Fatalf("Promote: %v", err)
	}
}

// acquireThroughFailover retries an acquire while the store answers
// ErrUnavailable (connections to the dead primary, the pool finding the
// new one), and returns the first other answer.
func acquireThroughFailover(t *testing.T, s *Store, key string) (store.Lease, error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		l, err := s.Acquire(testCtx(t), key, "worker-b", testTTL)
		if !errors.Is(err, store.ErrUnavailable) || time.Now().After(deadline) {
			return l, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// With a synchronous standby and AcceptPromotion, a failover is a dip, not
// an outage: the same store, through the multi-host DSN, grants again on
// the promoted standby with tokens above every token granted before, and
// logs lockdb_promotion_accepted. A store without AcceptPromotion, on the
// same lockdb, refuses (BACKEND_RESTORED) until the other has accepted.
func TestPromotedSyncStandbyGrantsAboveEveryEarlierToken(t *testing.T) {
	t.Parallel()
	primary, standby, dsn := newReplicatedLockdb(t, true)
	var acceptLog, refuseLog logLines
	accepting := openPromotionStore(t, dsn, true, &acceptLog)
	refusing := openPromotionStore(t, dsn, false, &refuseLog)
	if n := len(acceptLog.events(t, EventReplicationSync)); n != 1 {
		t.Fatalf("%d %s lines at Open on a synchronous primary; want 1", n, EventReplicationSync)
	}
	highest := grantRelease(t, accepting, "payout:acct-1", 20)
	failover(t, primary, standby)

	if _, err := acquireThroughFailover(t, refusing, "payout:acct-2"); !errors.Is(err, store.ErrBackendRestored) {
		t.Fatalf("without AcceptPromotion, Acquire after failover: %v; want ErrBackendRestored", err)
	}
	l, err := acquireThroughFailover(t, accepting, "payout:acct-1")
	if err != nil {
		t.Fatalf("with AcceptPromotion, Acquire after failover: %v; want a grant", err)
	}
	if l.Token <= highest {
		t.Fatalf("token %d after failover; %d was granted before it", l.Token, highest)
	}
	if ev := acceptLog.events(t, EventPromotionAccepted); len(ev) != 1 || ev[0]["fromTimeline"] != 1.0 || ev[0]["toTimeline"] != 2.0 {
		t.Fatalf("%s lines = %v; want one, from timeline 1 to 2", EventPromotionAccepted, ev)
	}
	// The promoted standby has no standby of its own: the store says so.
	if ev := acceptLog.events(t, EventReplicationAsync); len(ev) != 1 || ev[0]["timeline"] != 2.0 {
		t.Fatalf("%s lines = %v; want one, on timeline 2", EventReplicationAsync, ev)
	}
	if l2, err := refusing.Acquire(testCtx(t), "payout:acct-2", "worker-c", testTTL); err != nil || l2.Token <= l.Token {
		t.Fatalf("the other store after the stamp moved: %v, %v; want a grant above %d", l2, err, l.Token)
	}
}

// With an asynchronous standby, AcceptPromotion does not help: the store
// warned at Open, and a failover refuses grants as a restore does.
func TestPromotedAsyncStandbyIsRefusedEvenWithAcceptPromotion(t *testing.T) {
	t.Parallel()
	primary, standby, dsn := newReplicatedLockdb(t, false)
	var lines logLines
	s := openPromotionStore(t, dsn, true, &lines)
	if n := len(lines.events(t, EventReplicationAsync)); n != 1 {
		t.Fatalf("%d %s lines at Open on an asynchronous primary; want 1", n, EventReplicationAsync)
	}
	grantRelease(t, s, "payout:acct-1", 5)
	failover(t, primary, standby)
	if l, err := acquireThroughFailover(t, s, "payout:acct-1"); !errors.Is(err, store.ErrBackendRestored) {
		t.Fatalf("Acquire after an asynchronous failover: %v, %v; want ErrBackendRestored", l, err)
	}
	if n := len(lines.events(t, EventPromotionAccepted)); n != 0 {
		t.Fatalf("%d %s lines; want none", n, EventPromotionAccepted)
	}
}

func TestAcceptPromotionNeedsACheckInterval(t *testing.T) {
	cfg := conf(func(c *Config) {
		c.DSN, c.AcceptPromotion, c.ReplicationCheckInterval = "postgres://x@127.0.0.1/db", true, 0
	})
	if err := cfg.Validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Validate = %v; want ErrInvalidConfig", err)
	}
	cfg.AcceptPromotion = false
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate without AcceptPromotion = %v; want nil", err)
	}
}
