package stack_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

// roleEnv makes the test binary play a process of TestParentDeathStopsTheChild
// instead of running the tests.
const roleEnv = "STACK_TEST_ROLE"

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "parent":
		// Like `go run`: start the child, pass nothing on, wait.
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), roleEnv+"=child")
		cmd.ExtraFiles = []*os.File{os.NewFile(3, "report")}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(cmd.Process.Pid)
		_ = cmd.Wait()
		os.Exit(0)
	case "child":
		// Like `local up`: watch the parent, report, stop when it is gone.
		report := os.NewFile(3, "report")
		ctx, cancel := stack.WithParent(context.Background(), 10*time.Millisecond)
		defer cancel()
		fmt.Fprintln(report, "watching")
		<-ctx.Done()
		fmt.Fprintln(report, "stopped:", context.Cause(ctx))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestParentDeathStopsTheChild: a process whose parent is killed by
// SIGTERM (as `go run` is: it does not forward the signal) notices and
// stops, with ErrParentGone as the cause.
func TestParentDeathStopsTheChild(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	parent := exec.Command(os.Args[0])
	parent.Env = append(os.Environ(), roleEnv+"=parent")
	parent.ExtraFiles = []*os.File{w}
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()                                          // the child holds the only write end left
	_ = r.SetReadDeadline(time.Now().Add(time.Minute)) // a broken watch fails instead of hanging
	pidLine, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("parent printed no child pid: %v", err)
	}
	child, _ := strconv.Atoi(strings.TrimSpace(pidLine))
	t.Cleanup(func() { _ = syscall.Kill(child, syscall.SIGKILL) })
	report := bufio.NewReader(r)
	if l, err := report.ReadString('\n'); err != nil || l != "watching\n" {
		t.Fatalf("child reported %q, %v; want watching", l, err)
	}
	if err := parent.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = parent.Wait()
	l, err := report.ReadString('\n')
	if err != nil {
		t.Fatalf("child %d did not stop after its parent died: %v", child, err)
	}
	if want := "stopped: " + stack.ErrParentGone.Error() + "\n"; l != want {
		t.Errorf("child reported %q; want %q", l, want)
	}
}
