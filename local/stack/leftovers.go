package stack

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgcluster"
)

// OwnerFile is the file, in each large temporary folder a stack makes (its
// binaries, etcd's data), that holds the pid of the process that made it;
// internal/pgcluster writes the same file (pgcluster.OwnerFile) into every
// temporary cluster folder it creates, a stack's, a test's or a harness
// run's. A stack stopped normally removes those folders itself;
// RemoveLeftovers removes the ones whose owner died without removing them
// (SIGKILL of `local up`: some 425 MB per stack; a test binary killed at
// its timeout).
const OwnerFile = pgcluster.OwnerFile

// leftoverPatterns are the folders under os.TempDir() that RemoveLeftovers
// considers: a stack's binaries (inside its run folder, whose logs stay),
// etcd's data and the PostgreSQL clusters (internal/pgcluster's prefix).
// Only those holding an OwnerFile are considered.
var leftoverPatterns = []string{"dll-stack-*/bin", "dll-etcd-*", "pgcluster-*"}

// markOwned writes the current process's pid into dir's OwnerFile.
func markOwned(dir string) error {
	if err := os.WriteFile(filepath.Join(dir, OwnerFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return fmt.Errorf("stack: mark %s: %w", dir, err)
	}
	return nil
}

// processAlive reports whether a process with the pid exists (signal 0;
// EPERM means it exists under another user).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// RemoveLeftovers removes, under tmp, every folder of leftoverPatterns
// whose OwnerFile names a process that alive reports gone, and returns
// the folders it removed. A folder without an OwnerFile (made before
// pgcluster wrote one; remove such old folders by hand when nothing runs),
// with an unreadable one, or whose owner lives is
// kept: a running stack's folders are never touched. A reused pid keeps a
// dead stack's folders until that process ends too (the safe side). The
// errors of folders it could not remove are joined.
func RemoveLeftovers(tmp string, alive func(pid int) bool) ([]string, error) {
	var removed []string
	var errs []error
	for _, pat := range leftoverPatterns {
		dirs, err := filepath.Glob(filepath.Join(tmp, pat))
		if err != nil {
			return removed, fmt.Errorf("stack: leftovers: %w", err)
		}
		for _, d := range dirs {
			b, err := os.ReadFile(filepath.Join(d, OwnerFile))
			if errors.Is(err, fs.ErrNotExist) || err != nil {
				continue
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil || pid <= 0 || alive(pid) {
				continue
			}
			if err := os.RemoveAll(d); err != nil {
				errs = append(errs, fmt.Errorf("stack: remove leftover %s: %w", d, err))
				continue
			}
			removed = append(removed, d)
		}
	}
	return removed, errors.Join(errs...)
}
