package stack_test

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

// Callers that ask at the same time share one build: the same folder,
// holding every binary and lockctl.
func TestCachedBinariesAreBuiltOnceForEveryCaller(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the stack's binaries")
	}
	var wg sync.WaitGroup
	dirs := make([]string, 3)
	errs := make([]error, 3)
	for i := range dirs {
		wg.Go(func() { dirs[i], errs[i] = stack.CachedBinaries(t.Context()) })
	}
	wg.Wait()
	for i := range dirs {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if dirs[i] != dirs[0] {
			t.Errorf("caller %d got %s, caller 0 %s; want one folder", i, dirs[i], dirs[0])
		}
	}
	names := []string{filepath.Base(stack.Lockctl)}
	for name := range stack.Binaries {
		names = append(names, name)
	}
	for _, name := range names {
		if _, err := os.Stat(filepath.Join(dirs[0], name)); err != nil {
			t.Errorf("binary %s: %v", name, err)
		}
	}
}
