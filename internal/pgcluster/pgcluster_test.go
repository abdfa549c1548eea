package pgcluster

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func startCluster(t *testing.T) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	c, err := Start(ctx, Config{})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if _, err := os.Stat(c.Dir()); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cluster dir %s still exists after Close (stat: %v)", c.Dir(), err)
		}
	})
	return c
}

func execSQL(t *testing.T, dsn, sql string) {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(t.Context(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func countRows(t *testing.T, dsn string) int {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM survivor").Scan(&n); err != nil {
		t.Fatalf("count: %v", err)
	}
	return n
}

func TestDataSurvivesRestartAndKill(t *testing.T) {
	c := startCluster(t)
	ctx := t.Context()
	if err := c.CreateDatabase(ctx, "lockdb"); err != nil {
		t.Fatalf("CreateDatabase: %v", err)
	}
	dsn := c.DSN("lockdb")
	execSQL(t, dsn, "CREATE TABLE survivor (id int PRIMARY KEY)")
	execSQL(t, dsn, "INSERT INTO survivor VALUES (1)")
	port := c.Port()

	if err := c.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	if c.Port() != port {
		t.Fatalf("port after Restart = %d; want %d", c.Port(), port)
	}
	if got := countRows(t, dsn); got != 1 {
		t.Fatalf("rows after Restart = %d; want 1", got)
	}

	// A committed row survives SIGKILL of every server process: crash
	// recovery replays the WAL.
	execSQL(t, dsn, "INSERT INTO survivor VALUES (2)")
	if err := c.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if err := c.Kill(); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("second Kill: got %v, want ErrNotRunning", err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatalf("Start after Kill: %v", err)
	}
	if err := c.Start(ctx); !errors.Is(err, ErrRunning) {
		t.Fatalf("Start while running: got %v, want ErrRunning", err)
	}
	if got := countRows(t, dsn); got != 2 {
		t.Fatalf("rows after Kill and Start = %d; want 2", got)
	}

	if err := c.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	conn, err := pgx.Connect(ctx, dsn+"&connect_timeout=2")
	if err == nil {
		conn.Close(context.Background())
		t.Fatal("connected to a stopped server")
	}
}

func TestReuseGivenDir(t *testing.T) {
	dir, err := os.MkdirTemp("", "pgcluster-given-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// The server may run as another user (when the test runs as root): it
	// must be able to reach the data directory.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	c, err := Start(ctx, Config{Dir: dir})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := c.CreateDatabase(ctx, "kept"); err != nil {
		t.Fatalf("CreateDatabase: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "PG_VERSION")); err != nil {
		t.Fatalf("Close removed a caller's Dir: %v", err)
	}
	// A second cluster over the same Dir skips initdb and sees the database.
	c2, err := Start(ctx, Config{Dir: dir})
	if err != nil {
		t.Fatalf("second Start: %v", err)
	}
	defer c2.Close()
	execSQL(t, c2.DSN("kept"), "SELECT 1")
}

func TestMissingBinaries(t *testing.T) {
	_, err := Start(t.Context(), Config{BinDir: t.TempDir()})
	if !errors.Is(err, ErrBinariesMissing) {
		t.Fatalf("Start with an empty BinDir: got %v, want ErrBinariesMissing", err)
	}
	// The message says how to get them, in a newcomer's terms.
	for _, want := range []string{"apt-get install postgresql-15", "$" + EnvBinDir, "initdb"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q does not mention %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "Config.BinDir") {
		t.Errorf("message %q names a Go field", err)
	}
	t.Setenv(EnvBinDir, t.TempDir())
	if err := (Config{}).Validate(); !errors.Is(err, ErrBinariesMissing) {
		t.Fatalf("Validate with $%s empty dir: got %v, want ErrBinariesMissing", EnvBinDir, err)
	}
}

func TestInvalidConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Port: -1},
		{Port: 70000},
		{Settings: map[string]string{"port": "5432"}},
		{Settings: map[string]string{"Bad Name": "x"}},
		{Dir: "/tmp/" + strings.Repeat("x", 120)},
	} {
		if err := cfg.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Validate(%+v): got %v, want ErrInvalidConfig", cfg, err)
		}
	}
	// Every invalid field at once, not only the first.
	err := (Config{Port: -1, Settings: map[string]string{"port": "5432"}}).Validate()
	if err == nil || !strings.Contains(err.Error(), "port -1") || !strings.Contains(err.Error(), `setting "port"`) {
		t.Errorf("Validate(port -1, setting port) = %v; want both named", err)
	}
}

// Freeze makes the server accept connections and answer nothing, on an
// open connection and on a new one; Thaw brings both back; Close works on
// a frozen server (it thaws first).
func TestFreezeStopsAnswersAndThawResumes(t *testing.T) {
	c := startCluster(t)
	if err := c.CreateDatabase(t.Context(), "paydb"); err != nil {
		t.Fatalf("CreateDatabase: %v", err)
	}
	dsn := c.DSN("paydb")
	open, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close(context.Background())
	if err := c.Freeze(); err != nil {
		t.Fatalf("Freeze: %v", err)
	}
	if err := c.Freeze(); err != nil {
		t.Fatalf("second Freeze: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if _, err := open.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("a frozen server answered on an open connection")
	}
	ctx2, cancel2 := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel2()
	if conn, err := pgx.Connect(ctx2, dsn); err == nil {
		conn.Close(context.Background())
		t.Fatal("a frozen server completed a new connection's startup")
	}
	if err := c.Thaw(); err != nil {
		t.Fatalf("Thaw: %v", err)
	}
	execSQL(t, dsn, "SELECT 1")
	if err := c.Freeze(); err != nil {
		t.Fatal(err)
	}
	// startCluster's cleanup closes the cluster while it is frozen.
}

// A temporary cluster folder names its owner (OwnerFile, the local
// stack's mark, which its leftover cleanup reads) from its creation, and a
// LogPath outside it outlives it. Before, only a local stack marked its
// clusters, after they had started, so the folders of test and harness
// processes killed before Close piled up unmarked (3.5 GB seen), and a
// stack's server log was lost with its folder when the stack was killed.
func TestATemporaryClusterNamesItsOwnerAndItsLogOutlivesIt(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "postgres-test.log")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	c, err := Start(ctx, Config{LogPath: logPath})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(c.Dir(), OwnerFile))
	if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
		t.Errorf("%s in %s: %q (%v); want this process's pid %d", OwnerFile, c.Dir(), b, err, os.Getpid())
	}
	if c.LogPath() != logPath {
		t.Errorf("LogPath() = %s; want %s", c.LogPath(), logPath)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(c.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Close left %s (%v)", c.Dir(), err)
	}
	log, err := os.ReadFile(logPath)
	if err != nil || !strings.Contains(string(log), "database system is ready") {
		t.Errorf("the server log %s after Close: %v, %d bytes; want the server's start-up in it", logPath, err, len(log))
	}
}

// TestClustersCopiedFromTheTemplateHaveSystemIdentifiersOfTheirOwn: the
// first cluster runs initdb and keeps its output as the template (in a
// cache folder of the test's own); the next two copy it, and each starts
// with a system identifier of its own, as after initdb.
func TestClustersCopiedFromTheTemplateHaveSystemIdentifiersOfTheirOwn(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	seen := map[int64]int{}
	for i := range 3 {
		c := startCluster(t)
		conn, err := pgx.Connect(t.Context(), c.AdminDSN())
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		var id int64
		err = conn.QueryRow(t.Context(), "SELECT system_identifier FROM pg_control_system()").Scan(&id)
		conn.Close(context.Background())
		if err != nil {
			t.Fatalf("system identifier: %v", err)
		}
		if j, dup := seen[id]; dup {
			t.Errorf("cluster %d has the system identifier %d of cluster %d", i, id, j)
		}
		seen[id] = i
	}
	if ms, _ := filepath.Glob(filepath.Join(cache, "distributed-lock-lab", "pg-template", "*", "PG_VERSION")); len(ms) != 1 {
		t.Errorf("templates in %s: %v; want one", cache, ms)
	}
}

// TestAnInterruptedTemplateCopyIsRemovedWhenTheTemplateIsMade: a copy of
// initdb's output that a killed process left beside the template is
// removed by the next process that makes the template.
func TestAnInterruptedTemplateCopyIsRemovedWhenTheTemplateIsMade(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	c := startCluster(t)
	key, err := c.templateKey(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(cache, "distributed-lock-lab", "pg-template")
	// As a process killed between its copy and its rename leaves things.
	if err := os.RemoveAll(filepath.Join(root, key)); err != nil {
		t.Fatal(err)
	}
	leftover := filepath.Join(root, key+".tmp-12345")
	if err := os.MkdirAll(leftover, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(leftover, "PG_VERSION"), []byte("15\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	startCluster(t)
	if _, err := os.Stat(leftover); !os.IsNotExist(err) {
		t.Errorf("the interrupted copy %s after the template was made again: %v; want it gone", leftover, err)
	}
	if _, err := os.Stat(filepath.Join(root, key, "PG_VERSION")); err != nil {
		t.Errorf("the template made again: %v", err)
	}
}
