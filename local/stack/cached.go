package stack

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gofrs/flock"
)

// Lockctl is the operator CLI, built beside Binaries by CachedBinaries (a
// game day runs it); a Stack does not.
const Lockctl = "github.com/distributed-lock-lab/distributed-lock-lab/lockserver/cmd/lockctl"

// cacheKeep is how long a folder of CachedBinaries may go unused before a
// later build of other sources removes it (about 250 MB each); longer
// than any test binary's timeout.
const cacheKeep = 2 * time.Hour

// CachedBinaries returns a folder holding every command of Binaries and
// Lockctl, built from the sources of this module as they are now (it must
// run inside the module, as Build). The folder lives under the user's
// cache folder (os.UserCacheDir, else os.TempDir), named by a hash of the
// Go toolchain, the build settings, the files of every package the
// commands import from this module and the versions of the others; a test
// run builds once and every later call, of any process, reuses the folder
// until a source changes. Processes that ask at the same time wait for one
// build (a lock file) instead of each building. The caller must not write
// into the folder.
func CachedBinaries(ctx context.Context) (string, error) {
	key, err := sourceKey(ctx)
	if err != nil {
		return "", err
	}
	root, err := os.UserCacheDir()
	if err != nil {
		root = os.TempDir()
	}
	root = filepath.Join(root, "distributed-lock-lab", "stack-bin")
	dir := filepath.Join(root, key)
	if ready(dir) {
		return dir, nil
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", fmt.Errorf("stack: binaries cache: %w", err)
	}
	unlock, err := lockFile(ctx, dir+".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	if ready(dir) { // built while this process waited for the lock
		return dir, nil
	}
	tmp, err := os.MkdirTemp(root, key+".tmp-")
	if err != nil {
		return "", fmt.Errorf("stack: binaries cache: %w", err)
	}
	defer os.RemoveAll(tmp) // gone once renamed
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", fmt.Errorf("stack: binaries cache: %w", err)
	}
	pkgs := []string{Lockctl}
	for _, name := range sortedNames() {
		pkgs = append(pkgs, Binaries[name])
	}
	if err := buildInto(ctx, tmp, pkgs...); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", fmt.Errorf("stack: binaries cache: %w", err)
	}
	pruneCache(root, key)
	return dir, nil
}

// ready reports whether dir holds a finished build, marking it used.
func ready(dir string) bool {
	if _, err := os.Stat(dir); err != nil {
		return false
	}
	now := time.Now()
	_ = os.Chtimes(dir, now, now)
	return true
}

// pruneCache removes the folders of root other than key's that nobody
// used for cacheKeep, with their lock files, and leftovers of builds
// killed as long ago.
func pruneCache(root, key string) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || strings.HasPrefix(name, key) {
			continue
		}
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > cacheKeep {
			_ = os.RemoveAll(filepath.Join(root, name))
			_ = os.Remove(filepath.Join(root, name+".lock"))
		}
	}
}

// lockFile takes an exclusive flock on path (github.com/gofrs/flock),
// trying again every 100 ms while another process holds it, until ctx
// ends; unlock releases it.
func lockFile(ctx context.Context, path string) (unlock func(), err error) {
	l := flock.New(path)
	if _, err := l.TryLockContext(ctx, 100*time.Millisecond); err != nil {
		return nil, fmt.Errorf("stack: binaries cache lock: %w", err)
	}
	return func() { _ = l.Unlock() }, nil
}

// sourceKey hashes what the commands are built from: go env's toolchain
// and settings, and for each package the commands import (go list -deps),
// its path and module version, or the content of its files when it comes
// from a folder (this module, and the SDK modules it replaces by folders).
func sourceKey(ctx context.Context) (string, error) {
	h := sha256.New()
	env, err := goOutput(ctx, "env", "GOVERSION", "GOOS", "GOARCH", "GOAMD64", "GOARM64", "CGO_ENABLED", "GOFLAGS", "GOEXPERIMENT", "CC")
	if err != nil {
		return "", err
	}
	h.Write(env)
	const format = `{{if not .Standard}}{{.ImportPath}}|{{with .Module}}{{if not (or .Main (and .Replace (not .Replace.Version)))}}{{.Version}}{{end}}{{end}}|{{.Dir}}|{{join .GoFiles "|"}}|{{join .CgoFiles "|"}}|{{join .SFiles "|"}}|{{join .EmbedFiles "|"}}{{end}}`
	args := []string{"list", "-deps", "-f", format, Lockctl}
	for _, name := range sortedNames() {
		args = append(args, Binaries[name])
	}
	list, err := goOutput(ctx, args...)
	if err != nil {
		return "", err
	}
	sc := bufio.NewScanner(bytes.NewReader(list))
	for sc.Scan() {
		fields := strings.Split(sc.Text(), "|")
		if len(fields) < 3 {
			continue
		}
		fmt.Fprintf(h, "%s@%s\n", fields[0], fields[1])
		if fields[1] != "" {
			continue
		}
		files := slices.DeleteFunc(fields[3:], func(s string) bool { return s == "" })
		for _, name := range files {
			if err := hashFile(h, filepath.Join(fields[2], name)); err != nil {
				return "", err
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:24], nil
}

func hashFile(w io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("stack: hash sources: %w", err)
	}
	defer f.Close()
	fmt.Fprintf(w, "%s\n", filepath.Base(path))
	_, err = io.Copy(w, f)
	return err
}

// goOutput runs the go command with args and returns its standard output.
func goOutput(ctx context.Context, args ...string) ([]byte, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("%w: the go command is not on PATH: %v", ErrPrerequisite, err)
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("stack: go %s (run from inside the repository): %w\n%s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
