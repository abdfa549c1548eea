package harness_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/harness"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

// The runs of this test binary are shared: each (backend, cell) runs at
// most once, whichever test asks first, and every test reads the same Run.
// The run folders live in work, removed at exit unless a test
// failed (then its path is printed, the logs being the evidence).
var (
	workOnce sync.Once
	work     string // run folders
	bin      string
	workErr  error

	runsMu sync.Mutex
	runs   = map[string]*sharedRun{}
)

type sharedRun struct {
	once sync.Once
	run  *harness.Run
	err  error
}

func TestMain(m *testing.M) {
	flag.Parse()
	cloudMain()
	code := m.Run()
	if work != "" {
		if code == 0 {
			_ = os.RemoveAll(work)
		} else {
			fmt.Fprintf(os.Stderr, "harness: binaries and run folders kept in %s\n", work)
		}
	}
	os.Exit(code)
}

// binDir returns the folder of the stack's binaries
// (stack.CachedBinaries: built once for every package of the test run).
func binDir(t *testing.T) string {
	t.Helper()
	workOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if work, workErr = os.MkdirTemp("", "harness-test-"); workErr != nil {
			return
		}
		bin, workErr = stack.CachedBinaries(ctx)
	})
	if workErr != nil {
		t.Fatal(workErr)
	}
	return bin
}

var fullMatrix = flag.Bool("matrix.full", false, "run every fencing cell on both lock backends (make test-full), not each cell on one")

// backendsOf returns the lock backends cell runs on: both with
// -matrix.full; else one, alternating along harness.Cells, so that both
// backends still run cells.
func backendsOf(cell harness.Cell) []string {
	if *fullMatrix {
		return harness.Backends
	}
	i := slices.Index(harness.Cells, cell) % len(harness.Backends)
	return harness.Backends[i : i+1]
}

// runOf returns the run of backend and cell, starting it on first use.
func runOf(t *testing.T, backend string, cell harness.Cell) *harness.Run {
	t.Helper()
	bin := binDir(t)
	key := backend + "-" + cell.Name()
	runsMu.Lock()
	sr := runs[key]
	if sr == nil {
		sr = &sharedRun{}
		runs[key] = sr
	}
	runsMu.Unlock()
	sr.once.Do(func() {
		// Bounded on its own: a run may serve several tests.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		t0 := time.Now()
		sr.run, sr.err = harness.RunCell(ctx, backend, cell, harness.Options{BinDir: bin, OutDir: work})
		t.Logf("ran %s in %v", key, time.Since(t0).Round(10*time.Millisecond))
	})
	if sr.err != nil {
		t.Fatal(sr.err)
	}
	return sr.run
}
