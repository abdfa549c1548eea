package stack

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

// RemoveLeftovers removes exactly the stack folders whose owner is gone:
// not a live owner's, not a folder without an owner file (a test's
// cluster), not the run folder's logs, not a folder of another name.
func TestRemoveLeftoversRemovesOnlyDeadStacksFolders(t *testing.T) {
	tmp := t.TempDir()
	const live, dead = 1000, 2000
	mk := func(rel string, owner int) string {
		t.Helper()
		d := filepath.Join(tmp, rel)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "payload"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if owner > 0 {
			if err := os.WriteFile(filepath.Join(d, OwnerFile), []byte(strconv.Itoa(owner)+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	gone := []string{mk("dll-stack-1/bin", dead), mk("dll-etcd-1", dead), mk("pgcluster-1", dead)}
	kept := []string{
		mk("dll-stack-2/bin", live), mk("dll-etcd-2", live), mk("pgcluster-2", live), // a running stack
		mk("pgcluster-3", 0),         // no owner file: made before pgcluster wrote one
		mk("dll-stack-1/logs", dead), // the dead stack's run folder keeps its logs
		mk("other-1", dead),          // not a stack's pattern
	}
	garbled := mk("dll-etcd-3", 0)
	if err := os.WriteFile(filepath.Join(garbled, OwnerFile), []byte("not a pid"), 0o644); err != nil {
		t.Fatal(err)
	}
	kept = append(kept, garbled)

	removed, err := RemoveLeftovers(tmp, func(pid int) bool { return pid != dead })
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	slices.Sort(gone)
	if !slices.Equal(removed, gone) {
		t.Errorf("removed %v, want %v", removed, gone)
	}
	for _, d := range gone {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s still exists (%v)", d, err)
		}
	}
	for _, d := range kept {
		if _, err := os.Stat(filepath.Join(d, "payload")); err != nil {
			t.Errorf("%s was touched: %v", d, err)
		}
	}
}

// markOwned names this process, which processAlive sees; a process that
// has exited is seen gone.
func TestOwnerFileNamesALiveProcess(t *testing.T) {
	d := t.TempDir()
	if err := markOwned(d); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(d, OwnerFile))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(string(b[:len(b)-1]))
	if err != nil || pid != os.Getpid() || !processAlive(pid) {
		t.Fatalf("owner file %q: pid %d (%v), alive %v; want %d, alive", b, pid, err, processAlive(pid), os.Getpid())
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skipf("no true command: %v", err)
	}
	if processAlive(cmd.Process.Pid) {
		t.Errorf("pid %d of an exited and reaped process is seen alive", cmd.Process.Pid)
	}
}
