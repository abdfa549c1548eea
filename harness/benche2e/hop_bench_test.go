package benche2e_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// envEchoPeer, when set, makes this test binary an echo peer instead of
// running tests: it listens on a loopback port chosen by the OS, prints
// the address on stdout, echoes every byte it reads from one connection
// and exits when that connection closes (BenchmarkLoopbackRoundTrip).
const envEchoPeer = "BENCHE2E_ECHO_PEER"

func TestMain(m *testing.M) {
	if os.Getenv(envEchoPeer) != "" {
		os.Exit(echoPeer())
	}
	os.Exit(m.Run())
}

// echoPeer serves one connection as the peer process of
// BenchmarkLoopbackRoundTrip; it returns the exit status.
func echoPeer() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(ln.Addr().String())
	c, err := ln.Accept()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_, _ = io.Copy(c, c)
	return 0
}

// hopMessage is the size of one request of the round trip: about a small
// JSON body with its HTTP headers.
const hopMessage = 512

// BenchmarkLoopbackRoundTrip measures what one round trip over loopback
// TCP costs this machine in CPU and in context switches, with nothing of
// the pipeline in it: a 512-byte message written and the same bytes read
// back, once with the echo in a goroutine of this process and once in a
// process of its own (this test binary, re-executed), as every hop between
// the stack's services is. It reports cpu-µs/op (user and system time of
// both ends) and ctxsw/op (voluntary and involuntary context switches of
// both ends). Run it with -cpu 1,2 to see what GOMAXPROCS does; the peer
// process inherits the same GOMAXPROCS through the environment.
// docs/benchmarks.md ("What a hop costs this machine") uses it to explain
// the CPU per payout.
func BenchmarkLoopbackRoundTrip(b *testing.B) {
	b.Run("peer=goroutine", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.Copy(c, c)
			_ = c.Close()
		}()
		roundTrips(b, ln.Addr().String(), nil)
	})
	b.Run("peer=process", func(b *testing.B) {
		self, err := os.Executable()
		if err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), envEchoPeer+"=1", fmt.Sprintf("GOMAXPROCS=%d", runtime.GOMAXPROCS(0)))
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		addr, err := bufio.NewReader(out).ReadString('\n')
		if err != nil {
			_ = cmd.Process.Kill()
			b.Fatalf("echo peer: %v", err)
		}
		roundTrips(b, strings.TrimSpace(addr), cmd)
	})
}

// roundTrips runs b.N round trips against the echo at addr and reports
// their CPU and context switches, counting those of peer (which it waits
// for after closing the connection) as well as this process's.
func roundTrips(b *testing.B, addr string, peer *exec.Cmd) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	msg := make([]byte, hopMessage)
	back := make([]byte, hopMessage)
	before := usage(syscall.RUSAGE_SELF)
	childBefore := usage(syscall.RUSAGE_CHILDREN)
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, back); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	_ = c.Close()
	used := usage(syscall.RUSAGE_SELF).minus(before)
	if peer != nil {
		if err := peer.Wait(); err != nil {
			b.Fatalf("echo peer: %v", err)
		}
		used = used.plus(usage(syscall.RUSAGE_CHILDREN).minus(childBefore))
	}
	b.ReportMetric(float64(used.cpu.Microseconds())/float64(b.N), "cpu-µs/op")
	b.ReportMetric(float64(used.switches)/float64(b.N), "ctxsw/op")
}

// used is a process's CPU time and context switches (getrusage(2)).
type used struct {
	cpu      time.Duration
	switches int64
}

func usage(who int) used {
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		return used{}
	}
	return used{
		cpu:      time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
		switches: ru.Nvcsw + ru.Nivcsw,
	}
}

func (u used) minus(v used) used { return used{u.cpu - v.cpu, u.switches - v.switches} }
func (u used) plus(v used) used  { return used{u.cpu + v.cpu, u.switches + v.switches} }
