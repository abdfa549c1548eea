package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestMain lets the test binary stand in for the command: with
// ETCD_LOCAL_RUN_MAIN=1 it runs main with the arguments it was given.
func TestMain(m *testing.M) {
	if os.Getenv("ETCD_LOCAL_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestProcessPrintsEndpointsServesAndStopsOnSIGTERM(t *testing.T) {
	readyFile := filepath.Join(t.TempDir(), "ready.json")
	cmd := exec.Command(os.Args[0], "-members", "1", "-ready-file", readyFile)
	cmd.Env = append(os.Environ(), "ETCD_LOCAL_RUN_MAIN=1")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start etcd-local: %v", err)
	}
	exited := make(chan error, 1)
	lines := make(chan string, 1)
	// Exits when the process closes stdout (it exits).
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}
		for sc.Scan() {
		}
		exited <- cmd.Wait()
	}()
	reaped := false
	t.Cleanup(func() {
		if !reaped {
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	var line string
	select {
	case line = <-lines:
	case err := <-exited:
		reaped = true
		t.Fatalf("etcd-local exited before ready: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no ready line within 30s")
	}
	var r ready
	if err := json.Unmarshal([]byte(line), &r); err != nil || len(r.Endpoints) != 1 || r.PID != cmd.Process.Pid {
		t.Fatalf("ready line %q: %+v, %v; want one endpoint and the child's pid", line, r, err)
	}
	if b, err := os.ReadFile(readyFile); err != nil || string(b) != line+"\n" {
		t.Fatalf("ready file = %q, %v; want the ready line", b, err)
	}

	cli, err := clientv3.New(clientv3.Config{Endpoints: r.Endpoints, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "/hello", "world"); err != nil {
		t.Fatalf("Put to etcd-local: %v", err)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		reaped = true
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v; want status 0", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("etcd-local still running 15s after SIGTERM")
	}
	if _, err := os.Stat(readyFile); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("ready file after exit: %v; want it removed", err)
	}
}
