package pgstore

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgcluster"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// grantRelease takes key and gives it back n times, returning the last token.
func grantRelease(t *testing.T, s *Store, key string, n int) int64 {
	t.Helper()
	var last int64
	for range n {
		l, err := s.Acquire(testCtx(t), key, "worker-a", testTTL)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		if err := s.Release(testCtx(t), key, "worker-a", l.Token); err != nil {
			t.Fatalf("Release: %v", err)
		}
		last = l.Token
	}
	return last
}

// checkRefusedUntilAdvance is the argument every restore test ends with:
// on the restored lockdb a grant is refused (never a token at or below
// highest, the largest issued before the restore) until Advance, and the
// first grant after it is above highest.
func checkRefusedUntilAdvance(t *testing.T, s *Store, highest int64) {
	t.Helper()
	ctx := testCtx(t)
	l, err := s.Acquire(ctx, "payout:acct-1", "worker-b", testTTL)
	switch {
	case err == nil && l.Token <= highest:
		t.Fatalf("restored lockdb re-issued token %d; %d was already issued before the restore", l.Token, highest)
	case err == nil:
		t.Fatalf("restored lockdb granted token %d; want ErrBackendRestored until advance", l.Token)
	case !errors.Is(err, store.ErrBackendRestored):
		t.Fatalf("Acquire on the restored lockdb: %v; want ErrBackendRestored", err)
	}
	t.Logf("refused as it should be: %v", err)
	// A group grant on the restored lockdb is refused as a whole, each
	// member with ErrBackendRestored, and grants nothing.
	res := s.AcquireMany(ctx, []store.AcquireRequest{
		{Key: "payout:acct-1", Owner: "worker-b", TTL: testTTL}, {Key: "payout:acct-batch", Owner: "worker-c", TTL: testTTL}})
	for i, r := range res {
		if !errors.Is(r.Err, store.ErrBackendRestored) {
			t.Fatalf("AcquireMany member %d on the restored lockdb: %+v, %v; want ErrBackendRestored", i, r.Lease, r.Err)
		}
	}
	for _, key := range []string{"payout:acct-1", "payout:acct-batch"} {
		if st, err := s.Inspect(ctx, key); err != nil || st.Lease != nil {
			t.Fatalf("Inspect(%s) after a refused group grant: %+v, %v; want no lease", key, st.Lease, err)
		}
	}
	// Inspect still answers: it issues no token.
	if _, err := s.Inspect(ctx, "payout:acct-1"); err != nil {
		t.Fatalf("Inspect on the restored lockdb: %v", err)
	}
	if _, err := s.Advance(ctx, 0); !errors.Is(err, store.ErrInvalidArgument) {
		t.Fatalf("Advance(0): %v; want ErrInvalidArgument", err)
	}
	adv, err := s.Advance(ctx, highest)
	if err != nil {
		t.Fatalf("Advance: %v", err)
	}
	if adv.NextAbove < highest || adv.Previous == adv.Identity || adv.Previous == "" {
		t.Fatalf("Advance(%d) = %+v; want nextAbove >= %d and a new identity", highest, adv, highest)
	}
	l, err = s.Acquire(ctx, "payout:acct-1", "worker-b", testTTL)
	if err != nil {
		t.Fatalf("Acquire after Advance: %v", err)
	}
	if l.Token <= highest {
		t.Fatalf("after Advance(%d) the grant has token %d", highest, l.Token)
	}
}

// TestDumpRestoredIntoANewDatabaseRefusesGrantsUntilAdvance takes a real
// pg_dump of lockdb, grants more tokens, restores the dump into a new
// database (as an operator recovering lockdb would) and reopens the store
// on it: the sequence is back at the backup's value, so without the guard
// the next grant repeats a token already issued.
func TestDumpRestoredIntoANewDatabaseRefusesGrantsUntilAdvance(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s := openStore(t, dsn)
	grantRelease(t, s, "payout:acct-1", 3)
	held, err := s.Acquire(testCtx(t), "payout:held", "worker-h", testTTL) // live in the backup
	if err != nil {
		t.Fatal(err)
	}
	dump := filepath.Join(t.TempDir(), "lockdb.dump")
	pgtest.RunTool(t, "pg_dump", "--format=custom", "--file="+dump, "--dbname="+dsn)
	highest := grantRelease(t, s, "payout:acct-1", 5) // issued after the backup

	restoredDSN := pgtest.NewDatabase(t)
	pgtest.RunTool(t, "pg_restore", "--no-owner", "--exit-on-error", "--dbname="+restoredDSN, dump)
	restored := openStore(t, restoredDSN)
	// A handoff is a grant: refused like one, and then nothing changed
	// (the released half too); a plain release still works.
	_, err = restored.Handoff(testCtx(t), store.LeaseRef{Key: "payout:held", Owner: "worker-h", Token: held.Token},
		store.AcquireRequest{Key: "payout:held", Owner: "worker-b", TTL: testTTL})
	if !errors.Is(err, store.ErrBackendRestored) {
		t.Fatalf("Handoff on the restored lockdb: %v; want ErrBackendRestored", err)
	}
	if st, err := restored.Inspect(testCtx(t), "payout:held"); err != nil || st.Lease == nil || st.Lease.Owner != "worker-h" || st.Lease.Token != held.Token {
		t.Fatalf("after the refused handoff: %+v, %v; want still held by worker-h with token %d", st.Lease, err, held.Token)
	}
	if err := restored.Release(testCtx(t), "payout:held", "worker-h", held.Token); err != nil {
		t.Fatalf("Release on the restored lockdb: %v", err)
	}
	checkRefusedUntilAdvance(t, restored, highest)
}

// TestDumpRestoredOverTheSameDatabaseRefusesGrantsUntilAdvance restores
// the dump over lockdb itself (pg_restore --clean): same database, same
// cluster, same timeline, but the sequence is recreated. The store stays
// open throughout, as a lock-server would.
func TestDumpRestoredOverTheSameDatabaseRefusesGrantsUntilAdvance(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s := openStore(t, dsn)
	grantRelease(t, s, "payout:acct-1", 3)
	dump := filepath.Join(t.TempDir(), "lockdb.dump")
	pgtest.RunTool(t, "pg_dump", "--format=custom", "--file="+dump, "--dbname="+dsn)
	highest := grantRelease(t, s, "payout:acct-1", 5)

	s.pool.Reset() // pg_restore --clean waits for no lock held by the pool's connections
	pgtest.RunTool(t, "pg_restore", "--clean", "--no-owner", "--exit-on-error", "--dbname="+dsn, dump)
	checkRefusedUntilAdvance(t, s, highest)
}

// TestSequenceRestoredUnderALiveSessionRefusesGrants: PostgreSQL keeps the
// guard's plans for the session, so a session that ran the check before a
// restore must see the new facts after it. Only fencing_token_seq is
// restored from the dump (pg_restore --clean --table), under a pool of one
// connection that stays open: the sequence comes back at the backup's
// value under a new OID, and the guard itself refuses the grant, before
// the token draw would.
func TestSequenceRestoredUnderALiveSessionRefusesGrants(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s, err := Open(testCtx(t), conf(func(c *Config) { c.DSN, c.MaxConns = dsn, 1 }), nil)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	backend := func() (pid int32) {
		t.Helper()
		if err := s.pool.QueryRow(testCtx(t), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		return pid
	}
	session := backend()
	grantRelease(t, s, "payout:acct-1", 3)
	dump := filepath.Join(t.TempDir(), "lockdb.dump")
	pgtest.RunTool(t, "pg_dump", "--format=custom", "--file="+dump, "--dbname="+dsn)
	highest := grantRelease(t, s, "payout:acct-1", 5)

	pgtest.RunTool(t, "pg_restore", "--clean", "--no-owner", "--exit-on-error", "--table=fencing_token_seq", "--dbname="+dsn, dump)
	_, err = s.Acquire(testCtx(t), "payout:acct-2", "worker-b", testTTL)
	if !errors.Is(err, store.ErrBackendRestored) || !strings.Contains(err.Error(), "lockdb identity changed") {
		t.Fatalf("Acquire after the sequence was restored: %v; want the guard's refusal (lockdb identity changed)", err)
	}
	if pid := backend(); pid != session {
		t.Fatalf("the pool's session was replaced (backend %d, was %d): the check must run in the session that ran it before the restore", pid, session)
	}
	checkRefusedUntilAdvance(t, s, highest)
}

// TestIdentityMatchesAfterARestart: an ordinary restart (and crash
// recovery) changes no identity fact, so grants go on without an advance.
func TestIdentityMatchesAfterARestart(t *testing.T) {
	c, dsn := restartClusterDB(t)
	s := openStore(t, dsn)
	before := grantRelease(t, s, "payout:acct-1", 2)
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	s2 := openStore(t, dsn)
	l, err := s2.Acquire(testCtx(t), "payout:acct-1", "worker-a", testTTL)
	if err != nil || l.Token <= before {
		t.Fatalf("Acquire after a crash and restart: %+v %v; want a token above %d", l, err, before)
	}
}

// TestBaseBackupRecoveredToANewTimelineRefusesGrantsUntilAdvance takes a
// real physical backup (pg_basebackup with its WAL), grants more tokens,
// stops the server and puts the backup in place of its data directory
// with archive recovery to the backup's end (recovery_target =
// 'immediate'), which promotes onto a new timeline, as every point-in-time
// recovery does. Same cluster, same database OID, same sequence: only the
// timeline tells.
func TestBaseBackupRecoveredToANewTimelineRefusesGrantsUntilAdvance(t *testing.T) {
	c, dsn := newClusterDB(t)
	s := openStore(t, dsn)
	grantRelease(t, s, "payout:acct-1", 3)
	backup := filepath.Join(c.Dir(), "backup")
	pgtest.RunTool(t, "pg_basebackup", "--pgdata="+backup, "--wal-method=stream", "--checkpoint=fast", "--dbname="+c.AdminDSN())
	highest := grantRelease(t, s, "payout:acct-1", 5)
	_ = s.Close()

	if err := c.Stop(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(c.Dir(), "data")
	if err := os.Rename(data, data+".lost"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(backup, data); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "recovery.signal"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	conf, err := os.OpenFile(filepath.Join(data, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	// No archive: the WAL streamed into the backup is all there is.
	_, err = conf.WriteString("restore_command = 'false'\nrecovery_target = 'immediate'\nrecovery_target_action = 'promote'\n")
	if cerr := conf.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	chownToServer(t, data)
	if err := c.Start(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	awaitPromoted(t, c.AdminDSN())
	checkRefusedUntilAdvance(t, openStore(t, dsn), highest)
}

// chownToServer hands dir to the "postgres" user when the test runs as
// root (pg_basebackup, run by the test, wrote it as root).
func chownToServer(t *testing.T, dir string) {
	t.Helper()
	if os.Geteuid() != 0 {
		return
	}
	u, err := user.Lookup(pgcluster.Superuser)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	err = filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// awaitPromoted waits until the server at dsn has left recovery.
func awaitPromoted(t *testing.T, dsn string) {
	t.Helper()
	ctx := testCtx(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for {
		var inRecovery bool
		if err := conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery); err != nil {
			t.Fatalf("waiting for the end of recovery: %v", err)
		}
		if !inRecovery {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("the restored server did not leave recovery")
		case <-time.After(20 * time.Millisecond):
		}
	}
}
