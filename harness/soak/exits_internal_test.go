package soak

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

// A process that exits on its own ends the run's context at once, and the
// cause says which process, how it exited and what it logged last.
func TestExitOfAProcessEndsTheRunWithItsStatusAndLog(t *testing.T) {
	exited := make(chan stack.ProcessExit, 1)
	ctx, stop := watchExits(t.Context(), exited)
	defer stop()
	if ctx.Err() != nil {
		t.Fatalf("the run's context ended before any exit: %v", context.Cause(ctx))
	}
	exited <- stack.ProcessExit{Name: "executor-B", PID: 42, Err: errors.New("signal: killed"), LogPath: "/run/executor-B.log", LogTail: `{"msg":"function serving"}`}
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the run went on after the exit")
	}
	cause := context.Cause(ctx)
	if !errors.Is(cause, ErrProcessExited) {
		t.Fatalf("cause %v; want ErrProcessExited", cause)
	}
	for _, want := range []string{"executor-B", "pid 42", "signal: killed", "/run/executor-B.log", `{"msg":"function serving"}`} {
		if !strings.Contains(cause.Error(), want) {
			t.Errorf("cause %q does not say %q", cause, want)
		}
	}
}
