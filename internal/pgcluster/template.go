package pgcluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/gofrs/flock"
)

// initdbArgs are the arguments of initdb after "-D dataDir".
var initdbArgs = []string{"-A", "trust", "-U", Superuser, "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"}

// fromTemplate fills c.dataDir, which is empty, with a copy of what
// initdb makes, under a system identifier of its own as initdb would give
// it. initdb runs once per server version and user: its output is kept in
// the user's cache folder (os.UserCacheDir, else os.TempDir), and later
// clusters, of any process, copy it (a copy costs a tenth of initdb's
// CPU). Processes that ask at the same time wait for one initdb (a lock
// file).
func (c *Cluster) fromTemplate(ctx context.Context) error {
	key, err := c.templateKey(ctx)
	if err != nil {
		return err
	}
	root, err := os.UserCacheDir()
	if err != nil {
		root = os.TempDir()
	}
	root = filepath.Join(root, "distributed-lock-lab", "pg-template")
	dir := filepath.Join(root, key)
	if _, err := os.Stat(dir); err != nil {
		if err := os.MkdirAll(root, 0o755); err != nil {
			return fmt.Errorf("pgcluster: template folder: %w", err)
		}
		unlock, err := lockFile(ctx, dir+".lock")
		if err != nil {
			return err
		}
		defer unlock()
		if _, err := os.Stat(dir); err != nil { // nobody made it while this process waited
			// A creation of this template that was interrupted left its
			// copy; under the lock nobody else is making one.
			stale, _ := filepath.Glob(filepath.Join(root, key+".tmp-*"))
			for _, s := range stale {
				_ = os.RemoveAll(s)
			}
			if err := c.runTool(ctx, "initdb", append([]string{"-D", c.dataDir}, initdbArgs...)...); err != nil {
				return err
			}
			tmp, err := os.MkdirTemp(root, key+".tmp-")
			if err == nil {
				defer os.RemoveAll(tmp) // gone once renamed
				err = copyTree(c.dataDir, tmp, nil)
			}
			if err == nil {
				err = os.Rename(tmp, dir)
			}
			if err != nil {
				return fmt.Errorf("pgcluster: keep initdb's output as the template: %w", err)
			}
			return nil // this cluster is initdb's own
		}
	}
	if err := copyTree(dir, c.dataDir, c.cred); err != nil {
		return fmt.Errorf("pgcluster: copy the template %s: %w", dir, err)
	}
	return newSystemIdentifier(c.dataDir)
}

// templateKey names the template of this server version (postgres -V),
// binary folder, initdb arguments and user.
func (c *Cluster) templateKey(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, filepath.Join(c.cfg.BinDir, "postgres"), "-V").Output()
	if err != nil {
		return "", fmt.Errorf("pgcluster: postgres -V: %w", err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n%d\n", out, c.cfg.BinDir, strings.Join(initdbArgs, " "), os.Geteuid())
	return hex.EncodeToString(h.Sum(nil))[:24], nil
}

// copyTree copies the folders and regular files under src into dst (which
// may exist), keeping their permissions; with cred, they are given to its
// user.
func copyTree(src, dst string, cred *syscall.Credential) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(target, info.Mode().Perm()); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
		case d.Type().IsRegular():
			if err := copyFile(path, target, info.Mode().Perm()); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s is neither a folder nor a regular file", path)
		}
		if cred != nil {
			return os.Chown(target, int(cred.Uid), int(cred.Gid))
		}
		return nil
	})
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// walSegment matches the name of a WAL segment file.
var walSegment = regexp.MustCompile(`^[0-9A-F]{24}$`)

// newSystemIdentifier gives the cluster in data, which no server runs, a
// new random system identifier: the first field of global/pg_control
// (whose CRC-32C, the field that follows the data it covers, is computed
// again) and of the long header at the start of each WAL segment, which
// the server checks against it.
func newSystemIdentifier(data string) error {
	var idb [8]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return fmt.Errorf("pgcluster: system identifier: %w", err)
	}
	control := filepath.Join(data, "global", "pg_control")
	ctl, err := os.ReadFile(control)
	if err != nil {
		return fmt.Errorf("pgcluster: system identifier: %w", err)
	}
	castagnoli := crc32.MakeTable(crc32.Castagnoli)
	crcAt := -1
	for off := 8; off+4 <= min(len(ctl), 1024); off += 4 {
		if crc32.Checksum(ctl[:off], castagnoli) == binary.LittleEndian.Uint32(ctl[off:]) {
			crcAt = off
			break
		}
	}
	if crcAt < 0 {
		return fmt.Errorf("pgcluster: system identifier: no CRC found in %s", control)
	}
	old := bytes.Clone(ctl[:8])
	copy(ctl, idb[:])
	binary.LittleEndian.PutUint32(ctl[crcAt:], crc32.Checksum(ctl[:crcAt], castagnoli))
	// XLogLongPageHeaderData: magic, info, timeline, page address and
	// remaining length (24 bytes), then the system identifier.
	const sysidAt, longHeader = 24, 0x0002
	wal := filepath.Join(data, "pg_wal")
	entries, err := os.ReadDir(wal)
	if err != nil {
		return fmt.Errorf("pgcluster: system identifier: %w", err)
	}
	for _, e := range entries {
		if !walSegment.MatchString(e.Name()) {
			continue
		}
		f, err := os.OpenFile(filepath.Join(wal, e.Name()), os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("pgcluster: system identifier: %w", err)
		}
		var hdr [sysidAt + 8]byte
		_, err = io.ReadFull(f, hdr[:])
		if err == nil && (binary.LittleEndian.Uint16(hdr[2:])&longHeader == 0 || !bytes.Equal(hdr[sysidAt:], old)) {
			err = errors.New("its first page has no long header with the cluster's system identifier")
		}
		if err == nil {
			_, err = f.WriteAt(idb[:], sysidAt)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("pgcluster: system identifier of WAL segment %s: %w", e.Name(), err)
		}
	}
	if err := os.WriteFile(control, ctl, 0); err != nil {
		return fmt.Errorf("pgcluster: system identifier: %w", err)
	}
	return nil
}

// lockFile takes an exclusive flock on path (github.com/gofrs/flock),
// trying again every 100 ms while another process holds it, until ctx
// ends; unlock releases it.
func lockFile(ctx context.Context, path string) (unlock func(), err error) {
	l := flock.New(path)
	if _, err := l.TryLockContext(ctx, 100*time.Millisecond); err != nil {
		return nil, fmt.Errorf("pgcluster: waiting for another process's initdb: %w", err)
	}
	return func() { _ = l.Unlock() }, nil
}
