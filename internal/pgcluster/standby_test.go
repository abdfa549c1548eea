package pgcluster

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func queryOne[T any](t *testing.T, dsn, sql string) T {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	var v T
	if err := conn.QueryRow(t.Context(), sql).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

func startStandby(t *testing.T, primary *Cluster, name string) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	s, err := primary.StartStandby(ctx, StandbyConfig{Name: name})
	if err != nil {
		t.Fatalf("StartStandby: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close standby: %v", err)
		}
	})
	return s
}

// A synchronous standby has every commit the primary acknowledged: the
// primary is killed (SIGKILL, every process), the standby promoted, and
// the rows are there, on a new timeline, and the promoted server takes
// writes. While the standby is down, a commit on the primary does not
// return: that is what "synchronous" means here.
func TestSyncStandbyHasEveryAcknowledgedCommitAfterPromotion(t *testing.T) {
	ctx := t.Context()
	primary, err := Start(ctx, Config{})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = primary.Close() })
	standby := startStandby(t, primary, "standby1")
	if err := primary.SetSynchronousStandby(ctx, "standby1"); err != nil {
		t.Fatalf("SetSynchronousStandby: %v", err)
	}

	if got := queryOne[string](t, primary.AdminDSN(), `SELECT coalesce(string_agg(application_name || ':' || sync_state, ','), '') FROM pg_stat_replication`); got != "standby1:sync" {
		t.Fatalf("pg_stat_replication = %q; want standby1:sync", got)
	}
	dsn := primary.AdminDSN()
	execSQL(t, dsn, "CREATE TABLE survivor (id int PRIMARY KEY)")
	for i := range 50 {
		execSQL(t, dsn, "INSERT INTO survivor VALUES ("+itoa(i)+")")
	}
	if in, err := standby.InRecovery(ctx); err != nil || !in {
		t.Fatalf("standby InRecovery = %v, %v; want true", in, err)
	}
	if err := primary.Promote(ctx); !errors.Is(err, ErrNotStandby) {
		t.Fatalf("Promote of the primary: got %v, want ErrNotStandby", err)
	}

	if err := primary.Kill(); err != nil {
		t.Fatalf("Kill primary: %v", err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatalf("Promote: %v", err)
	}
	if in, err := standby.InRecovery(ctx); err != nil || in {
		t.Fatalf("after Promote InRecovery = %v, %v; want false", in, err)
	}
	if got := countRows(t, standby.AdminDSN()); got != 50 {
		t.Fatalf("rows on the promoted standby = %d; want every acknowledged one, 50", got)
	}
	if tl := queryOne[int32](t, standby.AdminDSN(), `SELECT timeline_id FROM pg_control_checkpoint()`); tl < 2 {
		// The checkpoint may lag the switch; the WAL file name does not.
		if name := queryOne[string](t, standby.AdminDSN(), `SELECT pg_walfile_name(pg_current_wal_lsn())`); name[:8] != "00000002" {
			t.Fatalf("promoted standby is on WAL file %s; want timeline 2", name)
		}
	}
	execSQL(t, standby.AdminDSN(), "INSERT INTO survivor VALUES (1000)")
}

func TestSyncCommitWaitsForTheStandby(t *testing.T) {
	ctx := t.Context()
	primary, err := Start(ctx, Config{})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = primary.Close() })
	standby := startStandby(t, primary, "standby1")
	if err := primary.SetSynchronousStandby(ctx, "standby1"); err != nil {
		t.Fatalf("SetSynchronousStandby: %v", err)
	}
	execSQL(t, primary.AdminDSN(), "CREATE TABLE survivor (id int PRIMARY KEY)")
	if err := standby.Kill(); err != nil {
		t.Fatalf("Kill standby: %v", err)
	}
	conn, err := pgx.Connect(ctx, primary.AdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if _, err := conn.Exec(short, "INSERT INTO survivor VALUES (1)"); err == nil {
		t.Fatal("a commit returned while its synchronous standby was down")
	}
}

func TestStandbyConfigValidate(t *testing.T) {
	for _, cfg := range []StandbyConfig{
		{},
		{Name: "Bad-Name"},
		{Name: "s1", Cluster: Config{Settings: map[string]string{"primary_conninfo": "x"}}},
		{Name: "s1", Cluster: Config{Port: -1}},
	} {
		if err := cfg.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Validate(%+v) = %v; want ErrInvalidConfig", cfg, err)
		}
	}
	if err := (StandbyConfig{Name: "s1"}).Validate(); err != nil {
		t.Errorf("Validate(s1) = %v; want nil", err)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// The lesson behind synchronous replication, at the database level: an
// asynchronous primary acknowledges commits its standby never receives
// (here the WAL senders are paused, as a lagging link would leave them);
// killed, its promoted standby lacks them, and its sequence hands out again
// values the dead primary had already handed out, although PostgreSQL logs
// a sequence 32 values ahead.
func TestAsyncStandbyLosesAcknowledgedCommitsAndRepeatsSequenceValues(t *testing.T) {
	ctx := t.Context()
	primary, err := Start(ctx, Config{})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = primary.Close() })
	standby := startStandby(t, primary, "standby1")
	dsn := primary.AdminDSN()
	execSQL(t, dsn, "CREATE SEQUENCE token_seq CACHE 1")
	execSQL(t, dsn, "CREATE TABLE grants (token bigint PRIMARY KEY)")
	execSQL(t, dsn, "INSERT INTO grants SELECT nextval('token_seq') FROM generate_series(1, 10)")
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		conn, err := pgx.Connect(ctx, standby.AdminDSN())
		if err == nil {
			var n int
			err = conn.QueryRow(ctx, "SELECT count(*) FROM grants").Scan(&n)
			conn.Close(context.Background())
			if err == nil && n == 10 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the standby never received the first 10 rows")
		}
	}
	if n, err := primary.PauseWALSenders(); err != nil || n != 1 {
		t.Fatalf("PauseWALSenders = %d, %v; want 1", n, err)
	}
	// 100 acknowledged commits, one value each: far more than 32 ahead.
	for range 100 {
		execSQL(t, dsn, "INSERT INTO grants SELECT nextval('token_seq')")
	}
	if err := primary.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatalf("Promote: %v", err)
	}
	if got := queryOne[int64](t, standby.AdminDSN(), "SELECT count(*) FROM grants"); got != 10 {
		t.Fatalf("rows on the promoted asynchronous standby = %d; want 10 (the 100 acknowledged while it lagged are lost)", got)
	}
	next := queryOne[int64](t, standby.AdminDSN(), "SELECT nextval('token_seq')")
	if next > 110 {
		t.Fatalf("promoted sequence's next value %d; want a repeat of one of 11..110, which the dead primary handed out", next)
	}
	t.Logf("the promoted standby's sequence hands out %d again (the dead primary had handed out up to 110)", next)
}
