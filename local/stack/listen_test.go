package stack

import (
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// listensOn sees this process's listeners on every address form a
// service may use: IPv4 loopback and wildcard, IPv6 loopback and the
// dual-stack wildcard (which is in /proc/net/tcp6 only).
func TestListensOnSeesEveryAddressForm(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:0", "0.0.0.0:0", "[::1]:0", ":0"} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Logf("%s: %v (no such address here)", addr, err)
			continue
		}
		port := ln.Addr().(*net.TCPAddr).Port
		if !listensOn(os.Getpid(), port) {
			t.Errorf("listensOn(self, %d) = false for a listener on %s", port, ln.Addr())
		}
		ln.Close()
		if listensOn(os.Getpid(), port) {
			t.Errorf("listensOn(self, %d) = true after the listener on %s closed", port, addr)
		}
	}
}

// A process in its own network namespace (a container's, or `unshare
// -n`) lists its sockets in its own /proc/PID/net, not in the reader's
// /proc/net: listensOn must read the former. The listener is this test
// binary run again (TestListenHelper). Needs root and unshare, which CI
// has.
func TestListensOnSeesAProcessInAnotherNetworkNamespace(t *testing.T) {
	unshare, err := exec.LookPath("unshare")
	if err != nil || os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs root and unshare (%v, euid %d)", err, os.Geteuid())
		}
		t.Skipf("needs root and unshare (%v, euid %d)", err, os.Geteuid())
	}
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(unshare, "--net", os.Args[0], "-test.run=^TestListenHelper$")
	cmd.Env = append(os.Environ(), listenHelperEnv+"="+strconv.Itoa(port))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for !listensOn(cmd.Process.Pid, port) {
		if time.Now().After(deadline) {
			t.Fatalf("listensOn(%d, %d) still false after 10 s: the listener in its own namespace is not seen", cmd.Process.Pid, port)
		}
		time.Sleep(20 * time.Millisecond) // polls /proc: nothing to wait on
	}
}

const listenHelperEnv = "STACK_LISTEN_HELPER_PORT"

// TestListenHelper listens on the port in listenHelperEnv until its stdin
// closes; it does nothing when run as a test.
func TestListenHelper(t *testing.T) {
	port := os.Getenv(listenHelperEnv)
	if port == "" {
		return
	}
	ln, err := net.Listen("tcp", "0.0.0.0:"+port)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, _ = io.Copy(io.Discard, os.Stdin)
}
