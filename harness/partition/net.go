// Package partition builds a small network of Linux network namespaces
// (one per process under test, all joined to a router namespace) and cuts
// and heals its links, one direction at a time, so that a partition drops
// packets between live processes. It needs root and iproute2.
//
//	n, err := partition.New(ctx, "etcd")     // namespaces named dllnet-<pid>-<seq>-...
//	defer n.Close()
//	a, _ := n.Add(ctx, "a")                    // a namespace, address a.Addr
//	cmd := a.Command(ctx, "/path/to/server")   // runs inside it (ip netns exec)
//	n.Cut(ctx, a, b)                           // a's packets to b vanish
//	n.Heal(ctx)
//
// The test process itself stays in its own namespace and reaches the nodes
// through Node.DialContext. Close removes every namespace; Sweep removes
// those left behind by a process that died before its Close.
// docs/reliability.md ("Partitions") says what the tests built on it found.
package partition

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// Prefix starts the name of every namespace this package creates, followed
// by the creating process's pid: Sweep reads it back.
const Prefix = "dllnet-"

// nsDir is where iproute2 keeps named network namespaces.
const nsDir = "/run/netns"

// Errors of this package; test them with errors.Is.
var (
	// ErrUnsupported: not root, or iproute2 missing, or the kernel refuses
	// network namespaces.
	ErrUnsupported = errors.New("partition: network namespaces unavailable")
	// ErrIP: an ip command failed; the error carries its output.
	ErrIP = errors.New("partition: ip command failed")
	// ErrTooManyNodes: a Net holds at most maxNodes nodes.
	ErrTooManyNodes = errors.New("partition: too many nodes")
)

// maxNodes bounds the nodes of a Net: node i gets subnet 10.77.i.0/24.
const maxNodes = 250

var seq atomic.Int64

// Available returns nil when this process can build a Net, else an error
// wrapping ErrUnsupported that says what is missing.
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: not root", ErrUnsupported)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("%w: iproute2's ip not on PATH", ErrUnsupported)
	}
	return nil
}

// Net is a router namespace and the nodes joined to it. Every node reaches
// every other through the router until Cut. Its methods are safe for
// concurrent use.
type Net struct {
	name   string // prefix of every namespace of this Net
	router string

	mu    sync.Mutex
	nodes []*Node
	cuts  map[[2]*Node]bool
}

// Node is one namespace of a Net with one address.
type Node struct {
	// Name is the namespace's name (ip netns).
	Name string
	// Addr is the node's IPv4 address, reachable from every other node.
	Addr string
}

// New creates the router namespace of a new Net; label (a few letters)
// goes into the namespaces' names so that a leftover says whose it was.
func New(ctx context.Context, label string) (*Net, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	n := &Net{name: fmt.Sprintf("%s%d-%d-%s", Prefix, os.Getpid(), seq.Add(1), label), cuts: map[[2]*Node]bool{}}
	n.router = n.name + "-r"
	if err := ip(ctx, "netns", "add", n.router); err != nil {
		return nil, err
	}
	if err := ip(ctx, "-n", n.router, "link", "set", "lo", "up"); err != nil {
		_ = n.Close()
		return nil, err
	}
	if err := run(ctx, "ip", "netns", "exec", n.router, "sysctl", "-qw", "net.ipv4.ip_forward=1"); err != nil {
		_ = n.Close()
		return nil, err
	}
	return n, nil
}

// Add creates a namespace joined to the router, with its loopback up, one
// address and a default route through the router.
func (n *Net) Add(ctx context.Context, label string) (*Node, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	i := len(n.nodes) + 1
	if i > maxNodes {
		return nil, ErrTooManyNodes
	}
	node := &Node{Name: fmt.Sprintf("%s-%s", n.name, label), Addr: fmt.Sprintf("10.77.%d.2", i)}
	if err := ip(ctx, "netns", "add", node.Name); err != nil {
		return nil, err
	}
	n.nodes = append(n.nodes, node)
	gw := fmt.Sprintf("10.77.%d.1", i)
	port := "n" + strconv.Itoa(i)
	for _, args := range [][]string{
		{"-n", n.router, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", node.Name},
		{"-n", n.router, "addr", "add", gw + "/24", "dev", port},
		{"-n", n.router, "link", "set", port, "up"},
		{"-n", node.Name, "link", "set", "lo", "up"},
		{"-n", node.Name, "addr", "add", node.Addr + "/24", "dev", "eth0"},
		{"-n", node.Name, "link", "set", "eth0", "up"},
		{"-n", node.Name, "route", "add", "default", "via", gw},
	} {
		if err := ip(ctx, args...); err != nil {
			return nil, err
		}
	}
	return node, nil
}

// Cut drops, at the router, every packet from a to b (not from b to a):
// silently, as a failed link does, so that a's connections to b time out
// rather than fail at once.
func (n *Net) Cut(ctx context.Context, from, to *Node) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cuts[[2]*Node{from, to}] {
		return nil
	}
	if err := ip(ctx, "-n", n.router, "rule", "add", "from", from.Addr, "to", to.Addr, "blackhole"); err != nil {
		return err
	}
	n.cuts[[2]*Node{from, to}] = true
	return nil
}

// Partition cuts every link between a node of side a and a node of side
// b, both ways.
func (n *Net) Partition(ctx context.Context, a, b []*Node) error {
	for _, x := range a {
		for _, y := range b {
			if err := errors.Join(n.Cut(ctx, x, y), n.Cut(ctx, y, x)); err != nil {
				return err
			}
		}
	}
	return nil
}

// Heal removes every cut.
func (n *Net) Heal(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	var errs []error
	for c := range n.cuts {
		if err := ip(ctx, "-n", n.router, "rule", "del", "from", c[0].Addr, "to", c[1].Addr, "blackhole"); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(n.cuts, c)
	}
	return errors.Join(errs...)
}

// Close removes the namespaces of the Net (their links go with them).
// Processes still running inside a node keep it alive, unreachable: stop
// them first.
func (n *Net) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	var errs []error
	for _, node := range n.nodes {
		errs = append(errs, ip(context.Background(), "netns", "del", node.Name))
	}
	n.nodes = nil
	errs = append(errs, ip(context.Background(), "netns", "del", n.router))
	return errors.Join(errs...)
}

// Command returns a command that runs name inside the node's namespace.
func (node *Node) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", node.Name, name}, args...)...)
}

// DialContext opens a TCP connection from inside the node's namespace, for
// the test process (an http.Transport's DialContext): the socket is created
// on a thread moved into the namespace for that one call, and keeps the
// namespace for its life. network must be "tcp" or "tcp4" and addr an IPv4
// address and port.
func (node *Node) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	// Ends when the dial does; the thread it locks goes back to the
	// scheduler only once it is back in the process's own namespace.
	go func() {
		runtime.LockOSThread()
		c, err := dialIn(ctx, node.Name, addr)
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// dialIn dials addr from namespace ns on the calling thread, which must be
// locked; it unlocks it when the thread is back in its own namespace (if
// not, the thread ends with its goroutine).
func dialIn(ctx context.Context, ns, addr string) (net.Conn, error) {
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, fmt.Errorf("partition: own namespace: %w", err)
	}
	defer self.Close()
	target, err := os.Open(filepath.Join(nsDir, ns))
	if err != nil {
		return nil, fmt.Errorf("partition: namespace %s: %w", ns, err)
	}
	defer target.Close()
	if err := setns(target); err != nil {
		return nil, fmt.Errorf("partition: enter %s: %w", ns, err)
	}
	c, derr := (&net.Dialer{}).DialContext(ctx, "tcp4", addr)
	if err := setns(self); err == nil {
		runtime.UnlockOSThread()
	}
	return c, derr
}

func setns(f *os.File) error { return unix.Setns(int(f.Fd()), unix.CLONE_NEWNET) }

// Sweep removes the namespaces of this package whose creating process is
// gone, after killing the processes left inside them (a test binary killed
// at its timeout leaves both). It returns what it removed.
func Sweep(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(nsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("partition: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		name := e.Name()
		rest, ok := strings.CutPrefix(name, Prefix)
		if !ok {
			continue
		}
		pidText, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || alive(pid) {
			continue
		}
		out, _ := exec.CommandContext(ctx, "ip", "netns", "pids", name).Output()
		for _, f := range strings.Fields(string(out)) {
			if p, err := strconv.Atoi(f); err == nil {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
		if err := ip(ctx, "netns", "del", name); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, name)
	}
	slices.Sort(removed)
	return removed, errors.Join(errs...)
}

// alive reports whether a process with this pid exists.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func ip(ctx context.Context, args ...string) error { return run(ctx, "ip", args...) }

func run(ctx context.Context, name string, args ...string) error {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%w: %s %s: %v: %s", ErrIP, name, strings.Join(args, " "), err, bytes.TrimSpace(out.Bytes()))
	}
	return nil
}
