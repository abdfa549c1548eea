package stack_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgcluster"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

// A start that fails before anything was logged leaves no empty run
// folder behind.
func TestFailedStartLeavesNoFolder(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	t.Setenv(pgcluster.EnvBinDir, filepath.Join(tmp, "no-postgres-here"))
	_, err := stack.Start(context.Background(), stack.Config{})
	if !errors.Is(err, stack.ErrPrerequisite) {
		t.Fatalf("Start = %v; want ErrPrerequisite", err)
	}
	left, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range left {
		t.Errorf("left behind in the temporary folder: %s", e.Name())
	}
}

// TestValidateReportsEveryInvalidField: one Validate names every field to
// fix, not only the first.
func TestValidateReportsEveryInvalidField(t *testing.T) {
	err := stack.Config{Backend: "redis", PubSub: "kafka", LogLevel: "loud"}.Validate()
	if !errors.Is(err, stack.ErrInvalidConfig) || !strings.Contains(err.Error(), "Backend") || !strings.Contains(err.Error(), "PubSub") ||
		!strings.Contains(err.Error(), "LogLevel") {
		t.Errorf("Validate = %v; want ErrInvalidConfig naming Backend, PubSub and LogLevel", err)
	}
}

// A binary folder without the binaries is refused with the command that
// builds the missing one, not the name of a Go function.
func TestMissingBinaryNamesTheBuildCommand(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	bin := t.TempDir()
	_, err := stack.Start(context.Background(), stack.Config{BinDir: bin})
	if !errors.Is(err, stack.ErrPrerequisite) {
		t.Fatalf("Start = %v; want ErrPrerequisite", err)
	}
	if !strings.Contains(err.Error(), "go build -o "+bin+string(filepath.Separator)) || !strings.Contains(err.Error(), "github.com/distributed-lock-lab/distributed-lock-lab/") {
		t.Fatalf("Start = %v; want the go build command of the missing binary", err)
	}
}

// Freeze and Thaw of a name that is no part of the stack are refused with
// ErrNoSuchPart, not ignored: a game-day fault that froze nothing would
// wait for alerts that cannot come.
func TestFreezeOfAnUnknownPartIsRefused(t *testing.T) {
	var st stack.Stack
	for _, f := range []func(string) error{st.Freeze, st.Thaw} {
		if err := f("no-such-part"); !errors.Is(err, stack.ErrNoSuchPart) {
			t.Errorf("got %v; want ErrNoSuchPart", err)
		}
	}
	// The same for the postmaster pid local up prints: a name that is no
	// cluster of the stack is an error, never pid 0 as if it were stopped.
	if pid, err := st.ClusterPID(stack.ClusterPaydb); !errors.Is(err, stack.ErrNoSuchPart) || pid != 0 {
		t.Errorf("ClusterPID of a stack without clusters = %d, %v; want ErrNoSuchPart", pid, err)
	}
}

// TestInterruptedStartSaysSo: Ctrl-C (the context ending) while the
// clusters start is reported as an interruption, not as the error of the
// step that saw it (before: "initdb: context canceled").
func TestInterruptedStartSaysSo(t *testing.T) {
	if err := stack.CheckPostgres(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	dir, bin := t.TempDir(), t.TempDir()
	// Stand-ins for the binaries: the start is interrupted before any
	// would answer.
	for name := range stack.Binaries {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\nexec sleep 30\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { // ends once a cluster has started writing its log, or the test ends
		for ctx.Err() == nil {
			if logs, _ := filepath.Glob(filepath.Join(dir, "postgres-*.log")); len(logs) > 0 {
				cancel()
				return
			}
			time.Sleep(time.Millisecond) // polling a condition
		}
	}()
	_, err := stack.Start(ctx, stack.Config{Dir: dir, BinDir: bin})
	if !errors.Is(err, stack.ErrInterrupted) || strings.Contains(err.Error(), "initdb") {
		t.Fatalf("Start interrupted while its clusters start: %v; want ErrInterrupted, naming no step", err)
	}
}

// TestExitedReportsWhatDiesOnItsOwnRestartsIncluded: Exited reports a
// process that exits without Kill or Stop, with its pid, exit status and
// the tail of its log, also when it is a restart (a later process than
// those present when Exited was first called); the process Kill ended is
// not reported.
func TestExitedReportsWhatDiesOnItsOwnRestartsIncluded(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	st := startWithExecutorA(ctx, t)
	exited := st.Exited()
	first := st.Executor("A")
	if err := st.Kill("executor-A"); err != nil {
		t.Fatal(err)
	}
	if err := st.Restart(ctx, "executor-A"); err != nil {
		t.Fatal(err)
	}
	restarted := st.Executor("A")
	// Killed behind the stack's back, as the kernel's OOM killer would.
	if err := restarted.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-exited:
		if e.Name != "executor-A" || e.PID != restarted.PID() || e.Err == nil || !strings.Contains(e.Err.Error(), "killed") ||
			e.LogPath != restarted.LogPath() || !strings.Contains(e.LogTail, `"service":"executor"`) {
			t.Errorf("Exited sent %+v; want the restarted executor-A (pid %d; the first, ended by Kill, was %d), killed, with its log's tail",
				e, restarted.PID(), first.PID())
		}
	case <-ctx.Done():
		t.Fatal("Exited reported nothing")
	}
}

// startWithExecutorA starts a stack with one executor, A, from the cached
// binaries, stopped when the test ends, its logs left in the run folder
// (checked); it skips the test with -short,
// and without PostgreSQL unless CI is set.
func startWithExecutorA(ctx context.Context, t *testing.T) *stack.Stack {
	t.Helper()
	if testing.Short() {
		t.Skip("starts the whole stack")
	}
	if err := stack.CheckPostgres(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	// No BinDir: Start takes CachedBinaries' folder itself.
	st, err := stack.Start(ctx, stack.Config{Dir: t.TempDir(), Executors: []stack.ExecutorSpec{{Name: "A"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		st.Stop()
		if logs, _ := filepath.Glob(filepath.Join(st.Dir(), "*.log")); len(logs) == 0 {
			t.Errorf("no log file left in the run folder %s after Stop", st.Dir())
		}
	})
	return st
}

// TestRestartIsNotReadyOnAnotherProcesssAnswer: a restarted process
// listens on its old port, which the kernel may have handed to another
// program while it was down. An answer on that port from the other
// program is not the restart's readiness: the restart fails as the
// process does (ErrExited, its port in use); once the port is free again,
// the next restart is ready and answered by the process itself.
func TestRestartIsNotReadyOnAnotherProcesssAnswer(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	st := startWithExecutorA(ctx, t)
	u, err := url.Parse(st.ExecutorURL("A"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Kill("executor-A"); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", u.Host)
	if err != nil {
		t.Fatalf("take executor-A's port %s: %v", u.Host, err)
	}
	other := &http.Server{Handler: http.NotFoundHandler(), ReadHeaderTimeout: time.Second}
	served := make(chan error, 1)
	go func() { served <- other.Serve(ln) }() // ends at other.Close
	err = st.Restart(ctx, "executor-A")
	if !errors.Is(err, stack.ErrExited) || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("Restart while another program answers on the port = %v; want ErrExited, the port in use", err)
	}
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	<-served
	if err := st.Restart(ctx, "executor-A"); err != nil {
		t.Fatalf("Restart on a free port: %v", err)
	}
	resp, err := http.Get(st.ExecutorURL("A") + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "executor_deliveries_total") {
		t.Errorf("GET /metrics on executor-A's port answered %s without executor_deliveries_total", resp.Status)
	}
}
