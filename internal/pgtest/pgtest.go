// Package pgtest is the PostgreSQL fixture of the project's tests: a new
// database per test (NewDatabase) in one throwaway cluster shared by the
// test binary, or on the server EnvAdminURL names, and clusters of their
// own (NewCluster) for tests that restart or kill the server. A package
// using it calls pgtest.Main(m), or goleak.VerifyTestMain(pgtest.Tests(m)),
// from its TestMain.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgcluster"
	"github.com/jackc/pgx/v5"
)

// EnvAdminURL names the environment variable holding the URL of an existing
// server (postgres://user@host:port/db?...) whose user may CREATE DATABASE.
// When set, no local cluster is started for NewDatabase.
const EnvAdminURL = "LAB_PG_ADMIN_URL"

// startTimeout bounds the start of a cluster, including initdb.
const startTimeout = 2 * time.Minute

var (
	mainCalled bool

	sharedOnce    sync.Once
	sharedMu      sync.Mutex         // guards sharedCluster against cleanup
	sharedCluster *pgcluster.Cluster // nil when EnvAdminURL is used
	sharedAdmin   string             // admin URL of the shared server
	sharedErr     error

	createMu sync.Mutex // CREATE DATABASE one at a time per binary
)

// Main runs the tests of m, then stops the shared cluster (if one was
// started) and removes its directory, and exits with the tests' exit code
// (1 if they passed but the cluster could not be closed). Call it from
// TestMain; NewDatabase fails a test whose binary did not. To check for
// leaked goroutines too, use Tests instead.
func Main(m *testing.M) { os.Exit(run(m)) }

// Runner is what goleak.VerifyTestMain takes: Run runs the tests and
// returns their exit code.
type Runner interface{ Run() int }

// Tests returns m as a Runner whose Run does what Main does (the tests,
// then the shared cluster and AtExit functions closed) without exiting,
// and leaves no goroutine of its own behind, so that a leak check after it
// sees only the tests' goroutines:
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.Tests(m)) }
func Tests(m *testing.M) Runner { return runner{m} }

type runner struct{ m *testing.M }

func (r runner) Run() int { return run(r.m) }

// run runs the tests of m and cleans up; it returns the exit code.
func run(m *testing.M) int {
	mainCalled = true
	// Ctrl-C or a kill of the test binary must not leave clusters and data
	// directories behind: clean up, then exit as the signal would.
	sigs := make(chan os.Signal, 1)
	done := make(chan struct{})
	exited := make(chan struct{})
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		defer close(exited)
		select {
		case <-sigs:
			fmt.Fprintln(os.Stderr, "pgtest: interrupted; removing test clusters")
			cleanup()
			os.Exit(130)
		case <-done:
		}
	}()
	code := m.Run()
	signal.Stop(sigs)
	close(done)
	<-exited
	if err := cleanup(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

var (
	exitMu    sync.Mutex
	exitFuncs []func() error
)

// AtExit registers f to run when Main ends, after the tests or on SIGINT
// or SIGTERM, in reverse order of registration. Use it for fixtures shared
// by a whole test binary (an embedded etcd, say) so that an interrupted run
// leaves nothing behind.
func AtExit(f func() error) {
	exitMu.Lock()
	defer exitMu.Unlock()
	exitFuncs = append(exitFuncs, f)
}

// Cleanup runs close at the end of t, or earlier if the test binary is
// interrupted (SIGINT, SIGTERM) while t runs, whichever comes first, and
// only once. Use it for a fixture of one test that holds processes or disk
// (an embedded etcd cluster) so that Ctrl-C leaves nothing behind.
func Cleanup(t testing.TB, close func() error) {
	var once sync.Once
	closeOnce := func() (err error) {
		once.Do(func() { err = close() })
		return err
	}
	AtExit(closeOnce)
	t.Cleanup(func() {
		if err := closeOnce(); err != nil {
			t.Errorf("pgtest: cleanup: %v", err)
		}
	})
}

// cleanup runs the AtExit functions and closes the shared cluster, once.
func cleanup() error {
	exitMu.Lock()
	fs := exitFuncs
	exitFuncs = nil
	exitMu.Unlock()
	var errs []error
	for i := len(fs) - 1; i >= 0; i-- {
		errs = append(errs, fs[i]())
	}
	sharedMu.Lock()
	c := sharedCluster
	sharedCluster = nil
	sharedMu.Unlock()
	if c != nil {
		if err := c.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close shared cluster: %w", err))
		}
	}
	return errors.Join(errs...)
}

func shared() (string, error) {
	sharedOnce.Do(func() {
		if u := os.Getenv(EnvAdminURL); u != "" {
			sharedAdmin = u
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		c, err := pgcluster.Start(ctx, pgcluster.Config{})
		if err != nil {
			sharedErr = fmt.Errorf("start shared cluster (or set %s): %w", EnvAdminURL, err)
			return
		}
		sharedMu.Lock()
		sharedCluster, sharedAdmin = c, c.AdminDSN()
		sharedMu.Unlock()
	})
	return sharedAdmin, sharedErr
}

// NewDatabase creates a brand-new empty database with a unique name and
// returns a URL connecting to it with the admin URL's credentials. It fails
// t when the server cannot be started or reached. Databases on the shared
// local cluster disappear with it; on an EnvAdminURL server they are
// dropped when t ends.
func NewDatabase(t testing.TB) string {
	t.Helper()
	if !mainCalled {
		t.Fatal("pgtest: call pgtest.Main(m) from TestMain, or the shared cluster outlives the tests")
	}
	admin, err := shared()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	name := dbName(t.Name())
	dsn, err := withDatabase(admin, name)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// FILE_COPY, as pgcluster.CreateDatabase: cheaper than the WAL_LOG default.
	if err := execAdmin(ctx, admin, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" STRATEGY FILE_COPY"); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	if sharedCluster == nil {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := execAdmin(ctx, admin, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
				t.Logf("pgtest: %v", err)
			}
		})
	}
	return dsn
}

// NewCluster starts a local cluster of the test's own, for tests that stop,
// restart or kill the server; it is closed (and its directory removed) when
// t ends. It fails t when the cluster cannot start.
func NewCluster(t testing.TB) *pgcluster.Cluster {
	t.Helper()
	return NewClusterWith(t, nil)
}

// NewClusterWith is NewCluster with extra server parameters (see
// pgcluster.Config.Settings).
func NewClusterWith(t testing.TB, settings map[string]string) *pgcluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Config{Settings: settings})
	if err != nil {
		t.Fatalf("pgtest: start cluster: %v", err)
	}
	Cleanup(t, c.Close)
	return c
}

func execAdmin(ctx context.Context, admin, sql string) error {
	createMu.Lock()
	defer createMu.Unlock()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return fmt.Errorf("connect to admin database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("%s: %w", sql, err)
	}
	return nil
}

// dbName derives a unique database name from a test name: "t_", the test
// name's letters and digits (lower case, at most 40), "_", 12 random hex
// digits; at most 63 bytes, PostgreSQL's limit.
func dbName(testName string) string {
	var b strings.Builder
	b.WriteString("t_")
	for _, r := range strings.ToLower(testName) {
		if b.Len() >= 42 {
			break
		}
		switch {
		case 'a' <= r && r <= 'z', '0' <= r && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	b.WriteByte('_')
	b.WriteString(hex.EncodeToString(rnd[:]))
	return b.String()
}

// withDatabase returns admin with its database replaced by name.
func withDatabase(admin, name string) (string, error) {
	u, err := url.Parse(admin)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("%s must be a postgres:// URL", EnvAdminURL)
	}
	u.Path = "/" + name
	u.RawPath = ""
	return u.String(), nil
}

// RunTool runs one of PostgreSQL's client programs (pg_dump, pg_restore,
// pg_basebackup, ...) from the server's binary directory (PG_BIN, else
// pgcluster.DefaultBinDir) with args, for at most a minute, and fails t
// with the program's output when it does not exit 0.
func RunTool(t testing.TB, name string, args ...string) {
	t.Helper()
	bin := os.Getenv(pgcluster.EnvBinDir)
	if bin == "" {
		bin = pgcluster.DefaultBinDir
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(bin, name), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// AwaitBlockedOnLock polls until a backend of dsn's database waits for a
// lock (pg_locks shows a lock not granted), so that a test can let the
// transaction holding it go on knowing the other one is queued behind it.
// It fails t if done delivers first (the request answered without
// blocking) or ctx ends.
func AwaitBlockedOnLock[R any](t *testing.T, ctx context.Context, dsn string, done <-chan R) {
	t.Helper()
	obs, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("pgtest: connect observer: %v", err)
	}
	defer obs.Close(context.Background())
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		var waiting int
		err := obs.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE NOT l.granted AND a.datname = current_database()`).Scan(&waiting)
		if err != nil {
			t.Fatalf("pgtest: observe pg_locks: %v", err)
		}
		if waiting > 0 {
			return
		}
		select {
		case r := <-done:
			t.Fatalf("pgtest: answered before blocking on the row lock: %+v", r)
		case <-ctx.Done():
			t.Fatal("pgtest: never blocked on the row lock")
		case <-tick.C:
		}
	}
}
