package pgstore

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// Inspect answers only from a server that takes writes. A pool that
// reaches a standby (a DSN listing several hosts without
// target_session_attrs=read-write, or naming a replica) answers a renewal
// with an error, since it is a write; a read would answer from the
// standby's copy, which may lag the primary: a lease revoked on the
// primary would read live there (GET /v1/locks/{key}, the wait queue's
// reads) while its renewal is refused.
func TestInspectOnAStandbyIsUnavailableNotStale(t *testing.T) {
	primary, standby, _ := newReplicatedLockdb(t, false)
	ctx := testCtx(t)
	p := openStore(t, primary.DSN("lockdb"))
	l, err := p.Acquire(ctx, "k", "worker-a", testTTL)
	if err != nil {
		t.Fatal(err)
	}
	// The standby has replayed the grant; then its replay is paused, and
	// the lease is revoked on the primary, which acknowledges it.
	admin, err := pgx.Connect(ctx, standby.DSN("lockdb"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM lock_lease WHERE lock_key = 'k' AND fencing_token = $1`, l.Token).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the standby never replayed the grant")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if _, err := admin.Exec(ctx, `SELECT pg_wal_replay_pause()`); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Revoke(ctx, "k", l.Token); err != nil {
		t.Fatal(err)
	}

	// A store whose DSN reaches the standby alone: it must not answer an
	// inspect from the standby's copy (nor open at all).
	s, err := Open(ctx, conf(func(c *Config) { c.DSN, c.SkipMigrations = standby.DSN("lockdb"), true }), nil)
	if err != nil {
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("Open on the standby = %v; want it refused as ErrUnavailable", err)
		}
		return
	}
	defer s.Close()
	if _, err := s.Renew(ctx, "k", "worker-a", l.Token); err == nil {
		t.Fatal("Renew on the standby succeeded; want it refused (a write)")
	}
	st, err := s.Inspect(ctx, "k")
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Inspect on the standby = %+v (lease %+v), %v; want ErrUnavailable, not the standby's copy", st, st.Lease, err)
	}
}
