package pgstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgcluster"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/servertest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/storetest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const testTTL = 30 * time.Second

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// openStore opens a store on dsn (migrating it) that is closed when t ends.
func openStore(t testing.TB, dsn string) *Store {
	t.Helper()
	s, err := Open(testCtx(t), conf(func(c *Config) { c.DSN = dsn }), nil)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// newClusterDB starts a cluster of the test's own with an empty database
// "lockdb" and returns both.
func newClusterDB(t *testing.T) (*pgcluster.Cluster, string) {
	t.Helper()
	c := pgtest.NewCluster(t)
	if err := c.CreateDatabase(testCtx(t), "lockdb"); err != nil {
		t.Fatalf("CreateDatabase: %v", err)
	}
	return c, c.DSN("lockdb")
}

func TestContract(t *testing.T) { storetest.Run(t, backend()) }

// TestContractOverHTTP runs the contract through lock-server with its
// defaults, which batch: concurrent calls reach PostgreSQL through the
// Batcher as AcquireMany, ReleaseMany and RenewMany statements. (The
// Batcher alone, without the server, runs the contract in memstore.)
// make test runs half of it here and the other half on etcd.
func TestContractOverHTTP(t *testing.T) {
	storetest.Run(t, servertest.OverHTTP(serverHalf(backend())))
}

var fullMatrix = flag.Bool("matrix.full", false, "run the suites through lock-server whole (make test-full), not the half make test runs on PostgreSQL")

// serverHalf is b for the suites through lock-server: in make test their
// even cases (storetest.Backend.Half), etcdstore's tests running the odd
// ones; every case with -matrix.full. The direct contract runs whole.
func serverHalf(b storetest.Backend) storetest.Backend {
	if !*fullMatrix {
		b.Half = 2
	}
	return b
}

// backend describes this store to the contract suite: a fresh database per
// store, on restartCluster for the restart tests.
func backend() storetest.Backend {
	return storetest.Backend{
		Name: "postgres",
		Open: func(t *testing.T) store.LockStore {
			return openStore(t, pgtest.NewDatabase(t))
		},
		Reopen: func(t *testing.T, s store.LockStore) store.LockStore {
			dsn := s.(*Store).dsn
			if err := s.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			return openStore(t, dsn)
		},
		Replica: func(t *testing.T, s store.LockStore) store.LockStore {
			return openStore(t, s.(*Store).dsn)
		},
		RestartBackend: func(t *testing.T) (store.LockStore, func()) {
			c, dsn := restartClusterDB(t)
			// The restart may run on a goroutine of its own (the
			// linearizability check's fault): t.Errorf, never t.Fatalf.
			return openStore(t, dsn), func() {
				if err := c.Restart(testCtx(t)); err != nil {
					t.Errorf("restart PostgreSQL: %v", err)
				}
			}
		},
		ShortTTL: 600 * time.Millisecond,
		StepClock: func(t *testing.T, s store.LockStore, d time.Duration) {
			stepClock(t, s.(*Store).dsn, d)
		},
	}
}

// restartCluster is the cluster of the tests that restart or kill the
// server without changing its settings (the contract's backend restarts
// among them), started on first use and shared: those tests run one at a
// time, each in a database of its own, and no other test uses the
// cluster, so a restart disturbs no test but the one making it (a cluster
// per test cost a few seconds each). A test that changes a setting or the
// data directory takes a cluster of its own (newClusterDB).
var restartCluster struct {
	once sync.Once
	c    *pgcluster.Cluster
	err  error
	dbs  atomic.Int64
}

// restartClusterDB returns restartCluster and a new empty database on it.
func restartClusterDB(t *testing.T) (*pgcluster.Cluster, string) {
	t.Helper()
	restartCluster.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		restartCluster.c, restartCluster.err = pgcluster.Start(ctx, pgcluster.Config{})
		if restartCluster.err == nil {
			pgtest.AtExit(restartCluster.c.Close)
		}
	})
	if restartCluster.err != nil {
		t.Fatalf("start the restart tests' cluster: %v", restartCluster.err)
	}
	name := fmt.Sprintf("lockdb_%d", restartCluster.dbs.Add(1))
	if err := restartCluster.c.CreateDatabase(testCtx(t), name); err != nil {
		t.Fatalf("CreateDatabase: %v", err)
	}
	return restartCluster.c, restartCluster.c.DSN(name)
}

var (
	clockMu      sync.Mutex
	clockOffsets = map[string]time.Duration{} // by DSN: how far stepClock has moved lock_clock()
)

// stepClock steps lock_clock() of dsn's database by d (forward when d > 0),
// on top of the steps made before: it replaces the function with one that
// adds the sum of the steps to clock_timestamp(), as an NTP step of lockdb's
// host clock would. Other databases keep the real clock.
func stepClock(t testing.TB, dsn string, d time.Duration) {
	t.Helper()
	clockMu.Lock()
	defer clockMu.Unlock()
	offset := clockOffsets[dsn] + d
	ctx := testCtx(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("stepClock: connect: %v", err)
	}
	defer conn.Close(context.Background())
	// Declared as the migration declares it, so it is inlined the same way.
	_, err = conn.Exec(ctx, fmt.Sprintf(`CREATE OR REPLACE FUNCTION lock_clock() RETURNS timestamptz
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$ SELECT clock_timestamp() + interval '%d microseconds' $$`, offset.Microseconds()))
	if err != nil {
		t.Fatalf("stepClock: replace lock_clock(): %v", err)
	}
	clockOffsets[dsn] = offset
}

// TestLockClockIsInlined: the statements name lock_clock(), and the planner
// replaces the call by clock_timestamp() itself, so the seam costs nothing
// on the grant path. A lock_clock() declared STABLE, or in PL/pgSQL, is
// not inlined and shows up in the plan; the test then fails.
func TestLockClockIsInlined(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s := openStore(t, dsn)
	ctx := testCtx(t)
	for name, stmt := range map[string]string{"acquire": acquireSQL, "renew": renewSQL, "release": releaseSQL, "inspect": inspectSQL,
		"acquireMany": acquireManySQL, "renewMany": renewManySQL, "releaseMany": releaseManySQL} {
		args := []any{"k", "worker-a", int64(30_000)}
		switch name {
		case "renew", "release":
			args = []any{"k", int64(1), "worker-a"}
		case "inspect":
			args = []any{"k"}
		case "acquireMany":
			args = []any{[]string{"k"}, []string{"worker-a"}, []int64{30_000}}
		case "renewMany", "releaseMany":
			args = []any{[]string{"k"}, []int64{1}, []string{"worker-a"}}
		}
		text := explain(t, ctx, s, name, stmt, args...)
		if strings.Contains(text, "lock_clock") || !strings.Contains(text, "clock_timestamp()") {
			t.Errorf("plan of %s calls lock_clock() instead of inlining clock_timestamp():\n%s", name, text)
		}
	}
}

// naiveAcquireSQL is the acquire statement as it is easy to write wrongly:
// the token is drawn in VALUES, before the statement waits for the key's row
// lock, and the update copies it. A grant that waited can then carry a
// token older than the grant it waited for.
const naiveAcquireSQL = `INSERT INTO lock_lease AS l (lock_key, owner_id, fencing_token, ttl_ms, granted_at, expires_at)
VALUES ($1, $2, nextval('fencing_token_seq'), $3::bigint, lock_clock(), lock_clock() + $3::bigint * interval '1 millisecond')
ON CONFLICT (lock_key) DO UPDATE SET
    owner_id = EXCLUDED.owner_id,
    fencing_token = EXCLUDED.fencing_token,
    ttl_ms = EXCLUDED.ttl_ms,
    granted_at = EXCLUDED.granted_at,
    expires_at = EXCLUDED.expires_at
WHERE l.expires_at IS NULL OR l.expires_at <= lock_clock()
RETURNING l.owner_id, l.fencing_token, l.ttl_ms, l.expires_at`

// TestTokenRegressionInterleaving forces the interleaving in which a slow
// granter starts its statement before a fast one but wins the row after it,
// and checks INV-02 on the outcome: the later grant has the greater token.
// The same scenario run with naiveAcquireSQL must make the check fail, which
// shows the test can detect the regression it guards against.
func TestTokenRegressionInterleaving(t *testing.T) {
	checkTokenRegression(t, slowGrantAfterFastGrant, acquireSQL, naiveAcquireSQL)
}

// checkTokenRegression runs the interleaving race with the store's
// statement, where INV-02 must hold, and with the naive one, where the
// check must fail.
func checkTokenRegression(t *testing.T, race func(t *testing.T, stmt string) (slow, fast int64), stmt, naive string) {
	t.Run("StoreStatement", func(t *testing.T) {
		slow, fast := race(t, stmt)
		if err := laterGrantHasGreaterToken(slow, fast); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("NaiveStatementIsCaught", func(t *testing.T) {
		slow, fast := race(t, naive)
		if err := laterGrantHasGreaterToken(slow, fast); err == nil {
			t.Fatalf("check passed for the naive statement (slow grant token %d, fast grant token %d); it cannot catch a token regression", slow, fast)
		} else {
			t.Logf("caught, as it must be: %v", err)
		}
	})
}

// laterGrantHasGreaterToken is INV-02 for one key granted twice: fast was
// granted (and released) first, slow afterwards.
func laterGrantHasGreaterToken(slow, fast int64) error {
	if slow <= fast {
		return fmt.Errorf("token regression: the later grant got token %d, not greater than the earlier grant's %d", slow, fast)
	}
	return nil
}

// slowGrantAfterFastGrant runs the interleaving with the store's acquire
// statement replaced by stmt and returns the tokens of the slow and the
// fast grant:
//
//  1. the key's row exists and is free (it was granted and released);
//  2. transaction X locks the row (SELECT ... FOR UPDATE);
//  3. the slow granter S calls Acquire, which blocks on the row lock;
//  4. inside X, the fast granter is granted the key (with the same
//     statement) and releases it; X commits;
//  5. S proceeds and is granted the free key.
func slowGrantAfterFastGrant(t *testing.T, stmt string) (slow, fast int64) {
	t.Helper()
	const key = "payout:acct-42"
	ctx := testCtx(t)
	dsn := pgtest.NewDatabase(t)
	s := openStore(t, dsn)
	s.acquireSQL = stmt
	type result struct {
		lease store.Lease
		err   error
	}
	earlier, fast, r := raceAFastGrant(t, ctx, dsn, s, key, s.acquireSQL, func() <-chan result {
		done := make(chan result, 1)
		go func() {
			l, err := s.Acquire(ctx, key, "slow-worker", testTTL)
			done <- result{l, err}
		}()
		return done
	})
	if r.err != nil {
		t.Fatalf("slow Acquire: %v", r.err)
	}
	t.Logf("tokens: earlier grant %d, fast grant %d, slow grant %d", earlier, fast, r.lease.Token)
	return r.lease.Token, fast
}

// raceAFastGrant plays steps 1 to 5 of slowGrantAfterFastGrant on key:
// slow starts the slow granter (its answer comes on the channel it
// returns), and the fast grant inside X uses the statement fastSQL. It
// returns the earlier grant's token, the fast grant's token and the slow
// granter's answer.
func raceAFastGrant[R any](t *testing.T, ctx context.Context, dsn string, s *Store, key, fastSQL string, slow func() <-chan R) (earlier, fast int64, answer R) {
	t.Helper()
	first, err := s.Acquire(ctx, key, "earlier-worker", testTTL)
	if err != nil {
		t.Fatalf("first Acquire: %v", err)
	}
	if err := s.Release(ctx, key, "earlier-worker", first.Token); err != nil {
		t.Fatalf("first Release: %v", err)
	}

	xConn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect X: %v", err)
	}
	defer xConn.Close(context.Background())
	x, err := xConn.Begin(ctx)
	if err != nil {
		t.Fatalf("begin X: %v", err)
	}
	defer x.Rollback(context.Background())
	if _, err := x.Exec(ctx, `SELECT 1 FROM lock_lease WHERE lock_key = $1 FOR UPDATE`, key); err != nil {
		t.Fatalf("X: lock the row: %v", err)
	}

	slowDone := slow()
	pgtest.AwaitBlockedOnLock(t, ctx, dsn, slowDone)

	if err := x.QueryRow(ctx, fastSQL, key, "fast-worker", testTTL.Milliseconds()).Scan(new(string), &fast, new(int64), new(time.Time)); err != nil {
		t.Fatalf("X: fast grant: %v", err)
	}
	tag, err := x.Exec(ctx, releaseSQL, key, fast, "fast-worker")
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("X: fast release: %v, %d rows", err, tag.RowsAffected())
	}
	if err := x.Commit(ctx); err != nil {
		t.Fatalf("X: commit: %v", err)
	}

	select {
	case answer = <-slowDone:
	case <-ctx.Done():
		t.Fatal("the slow granter did not return after X committed")
	}
	return first.Token, fast, answer
}

// TestFirstCallAfterServerBounceSucceeds shows the pool drops connections
// the server closed before using them, so the first call after a restart
// or a crash works, while calls during the outage report ErrUnavailable.
func TestCallsRecoverAfterServerBounce(t *testing.T) {
	c, dsn := restartClusterDB(t)
	s := openStore(t, dsn)
	ctx := testCtx(t)

	// fillPool leaves as many idle connections in the pool as it holds.
	fillPool := func() {
		var conns []*pgxpool.Conn
		for range DefaultMaxConns {
			conn, err := s.pool.Acquire(ctx)
			if err != nil {
				t.Fatalf("pool Acquire: %v", err)
			}
			conns = append(conns, conn)
		}
		for _, conn := range conns {
			conn.Release()
		}
	}
	// retry calls f until it succeeds. Each failure must be ErrUnavailable
	// (a dead pooled connection, discarded by the failure), never a wrong
	// answer, and the pool must recover before it has tried every stale
	// connection once.
	retry := func(what string, f func() error) {
		t.Helper()
		for attempt := 0; ; attempt++ {
			err := f()
			if err == nil {
				return
			}
			if !errors.Is(err, store.ErrUnavailable) || attempt > int(DefaultMaxConns) {
				t.Fatalf("%s, attempt %d: %v", what, attempt+1, err)
			}
		}
	}
	grantAndRelease := func(when string) {
		t.Helper()
		var l store.Lease
		retry("Acquire "+when, func() (err error) {
			l, err = s.Acquire(ctx, "payout:acct-1", "worker", testTTL)
			if errors.Is(err, store.ErrLockHeld) {
				// An earlier attempt was granted but its answer was lost
				// with its connection: the orphan expires after testTTL.
				t.Fatalf("Acquire %s: %v", when, err)
			}
			return err
		})
		retry("Release "+when, func() error { return s.Release(ctx, "payout:acct-1", "worker", l.Token) })
	}

	fillPool()
	if err := c.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	grantAndRelease("after a fast-shutdown restart")

	fillPool()
	if err := c.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	_, err := s.Acquire(ctx, "payout:acct-1", "worker", testTTL)
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Acquire while the server is down: got %v, want ErrUnavailable", err)
	}
	if err := s.Ping(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Ping while the server is down: got %v, want ErrUnavailable", err)
	}
	if _, err := Open(ctx, conf(func(c *Config) { c.DSN = dsn }), nil); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Open while the server is down: got %v, want ErrUnavailable", err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatalf("Start after Kill: %v", err)
	}
	grantAndRelease("after a crash and restart")
}

// TestDeadlineIsUnavailable: a call cut short by its context reports
// ErrUnavailable (the outcome is unknown) and keeps the context's error.
func TestDeadlineIsUnavailable(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s := openStore(t, dsn)
	ctx := testCtx(t)
	if _, err := s.Acquire(ctx, "k", "a", testTTL); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	// Hold the row lock so the next statement on the key waits.
	x, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close(context.Background())
	tx, err := x.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `SELECT 1 FROM lock_lease WHERE lock_key = 'k' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err = s.Acquire(short, "k", "b", testTTL)
	if !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire past its deadline: got %v, want ErrUnavailable wrapping context.DeadlineExceeded", err)
	}
}

// TestMigrateConcurrently: lock-servers starting together migrate once.
func TestMigrateConcurrently(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := testCtx(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() { errs <- Migrate(ctx, dsn) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("Migrate: %v", err)
		}
	}
	if err := Migrate(ctx, dsn); err != nil {
		t.Fatalf("Migrate with nothing pending: %v", err)
	}
	s := openStore(t, dsn)
	var applied int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM `+migrationTable+` WHERE version_id > 0`).Scan(&applied); err != nil {
		t.Fatal(err)
	}
	entries, err := migrations.ReadDir("migrations")
	if err != nil {
		t.Fatal(err)
	}
	if applied != len(entries) {
		t.Fatalf("%d migrations recorded; want %d, one per file", applied, len(entries))
	}
}

func TestConfigValidate(t *testing.T) {
	for _, cfg := range []Config{
		conf(nil),
		conf(func(c *Config) { c.DSN, c.MaxConns = "postgres://u@h/db", 0 }),
		conf(func(c *Config) { c.DSN, c.ConnectTimeout = "postgres://u@h/db", -time.Second }),
		conf(func(c *Config) { c.DSN, c.ClockOffsetBound = "postgres://u@h/db", -time.Millisecond }),
		conf(func(c *Config) { c.DSN = "postgres://u@h:notaport/db" }),
		{DSN: "postgres://u@h/db"}, // the zero value is not the defaults
	} {
		if err := cfg.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Validate(%+v): got %v, want ErrInvalidConfig", cfg, err)
		}
	}
	if err := conf(func(c *Config) { c.DSN = "postgres://u@h/db" }).Validate(); err != nil {
		t.Errorf("Validate of a minimal config: %v", err)
	}
	// Every invalid field at once, not only the first.
	err := (Config{}).Validate()
	for _, want := range []string{"MaxConns", "ClockOffsetBound", "ConnectTimeout", "DSN"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate(Config{}) = %v; want it to name %s", err, want)
		}
	}
}

// conf returns DefaultConfig changed by set (nil: unchanged).
func conf(set func(*Config)) Config {
	c := DefaultConfig()
	if set != nil {
		set(&c)
	}
	return c
}

// BenchmarkRawSQL measures the store's acquire and release statements
// themselves on a pgx pool, one pair per iteration, each client on its own
// key: the baseline that lock-server and the SDK add their cost to. With
// more than one client, ns/op is wall time divided by pairs completed by all
// clients (the inverse of throughput), not the latency of one pair.
func BenchmarkRawSQL(b *testing.B) {
	dsn := pgtest.NewDatabase(b)
	ctx := testCtx(b)
	if err := Migrate(ctx, dsn); err != nil {
		b.Fatalf("Migrate: %v", err)
	}
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		b.Fatal(err)
	}
	pc.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	for _, clients := range []int{1, 8} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for c := range clients {
				wg.Go(func() {
					key, owner := fmt.Sprintf("bench:%d", c), fmt.Sprintf("client-%d", c)
					for next.Add(1) <= int64(b.N) {
						var token int64
						err := pool.QueryRow(ctx, acquireSQL, key, owner, int64(30_000)).Scan(new(string), &token, new(int64), new(time.Time))
						if err != nil {
							b.Errorf("acquire: %v", err)
							return
						}
						tag, err := pool.Exec(ctx, releaseSQL, key, token, owner)
						if err != nil || tag.RowsAffected() != 1 {
							b.Errorf("release: %v, %d rows", err, tag.RowsAffected())
							return
						}
					}
				})
			}
			wg.Wait()
		})
	}
}

// TestLinearizableAcrossCrash runs the contract's linearizability check
// while PostgreSQL is killed (SIGKILL to the server and every backend) and
// brought back through crash recovery under the clients: with fsync on,
// nothing acknowledged may be lost, and calls cut off are unknown outcomes.
func TestLinearizableAcrossCrash(t *testing.T) {
	c, dsn := restartClusterDB(t)
	s := openStore(t, dsn)
	storetest.CheckLinearizable(t, "postgres-crash", s, func() {
		if err := c.Kill(); err != nil {
			t.Errorf("Kill: %v", err)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Start(ctx); err != nil {
			t.Errorf("Start after the crash: %v", err)
		}
	})
}

// logLines is a logger whose JSON lines a test can read back.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logLines) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// events returns the lines whose event attribute is event.
func (l *logLines) events(t *testing.T, event string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range bytes.Split(l.buf.Bytes(), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["event"] == event {
			out = append(out, m)
		}
	}
	return out
}

// TestOpenLogsLockdbClockOffset: Open logs one line stating that expiry
// follows lockdb's wall clock, with the measured offset; a warning when
// lockdb's clock is further off than the bound.
func TestOpenLogsLockdbClockOffset(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := testCtx(t)
	open := func(lines *logLines) {
		t.Helper()
		s, err := Open(ctx, conf(func(c *Config) { c.DSN = dsn }), lines.logger())
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		_ = s.Close()
	}
	check := func(lines *logLines, level string, wantOffset time.Duration) {
		t.Helper()
		got := lines.events(t, eventClockOffset)
		if len(got) != 1 {
			t.Fatalf("%d %s lines at Open; want 1", len(got), eventClockOffset)
		}
		line := got[0]
		offset, _ := line["offsetMs"].(float64)
		if line["level"] != level || !strings.Contains(line["msg"].(string), "slewing only") ||
			offset < float64((wantOffset-time.Second).Milliseconds()) || offset > float64((wantOffset+time.Second).Milliseconds()) {
			t.Fatalf("Open logged %v; want level %s, the slew-only requirement and offsetMs within a second of %v", line, level, wantOffset)
		}
	}

	var same logLines
	open(&same) // migrates, so that lock_clock() exists before it is stepped
	check(&same, "INFO", 0)

	stepClock(t, dsn, 10*time.Second)
	var ahead logLines
	open(&ahead)
	check(&ahead, "WARN", 10*time.Second)
}

// TestRenewLogsBackwardClockStep: a renewal that finds lockdb's clock
// earlier than at the previous renewal logs lockdb_clock_stepped at ERROR,
// and still renews; ordinary renewals log nothing of the kind.
func TestRenewLogsBackwardClockStep(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := testCtx(t)
	var lines logLines
	s, err := Open(ctx, conf(func(c *Config) { c.DSN = dsn }), lines.logger())
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()
	a, err := s.Acquire(ctx, "k", "worker-a", testTTL)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	for range 2 {
		if _, err := s.Renew(ctx, "k", "worker-a", a.Token); err != nil {
			t.Fatalf("Renew: %v", err)
		}
	}
	if got := lines.events(t, eventClockStepped); len(got) != 0 {
		t.Fatalf("ordinary renewals logged %v", got)
	}

	// Less than a TTL: the lease stays live, and only the renewal can tell.
	stepClock(t, dsn, -10*time.Second)
	if _, err := s.Renew(ctx, "k", "worker-a", a.Token); err != nil {
		t.Fatalf("Renew after the step: %v", err)
	}
	got := lines.events(t, eventClockStepped)
	if len(got) != 1 {
		t.Fatalf("%d %s lines after a backward step; want 1", len(got), eventClockStepped)
	}
	if ms, _ := got[0]["steppedBackAtLeastMs"].(float64); got[0]["level"] != "ERROR" || got[0]["token"] != float64(a.Token) || ms < 9_000 || ms > 10_000 {
		t.Fatalf("logged %v; want ERROR with token %d and steppedBackAtLeastMs in [9000, 10000]", got[0], a.Token)
	}
}

// explain returns the verbose plan of stmt (called name in failures) with
// args, one line of the plan a line.
func explain(t *testing.T, ctx context.Context, s *Store, name, stmt string, args ...any) string {
	t.Helper()
	rows, err := s.pool.Query(ctx, "EXPLAIN (VERBOSE) "+stmt, args...)
	if err != nil {
		t.Fatalf("EXPLAIN %s: %v", name, err)
	}
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("EXPLAIN %s: %v", name, err)
	}
	return strings.Join(plan, "\n")
}

// TestLinearizableWaiting: the linearizability workload through a
// lock-server whose acquires all wait (handoffs to parked waiters).
func TestLinearizableWaiting(t *testing.T) {
	b := backend()
	s := b.Open(t)
	t.Cleanup(func() { _ = s.Close() })
	servertest.CheckLinearizableWaiting(t, "postgres", s, false)
}

// TestLinearizableWaitingCancelled: the same with some waiting acquires
// cancelled mid-wait.
func TestLinearizableWaitingCancelled(t *testing.T) {
	b := backend()
	s := b.Open(t)
	t.Cleanup(func() { _ = s.Close() })
	servertest.CheckLinearizableWaiting(t, "postgres", s, true)
}
