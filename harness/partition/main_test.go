package partition_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/distributed-lock-lab/distributed-lock-lab/harness/partition"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgcluster"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/config"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/pgstore"
)

// full runs every scenario (make partitions); without it `make test` runs
// the short set.
var full = flag.Bool("partitions.full", false, "run every partition scenario, not only the short set")

func TestMain(m *testing.M) {
	flag.Parse()
	if partition.Available() == nil {
		if removed, err := partition.Sweep(context.Background()); err != nil || len(removed) > 0 {
			fmt.Fprintf(os.Stderr, "partition: swept leftover namespaces %v (%v)\n", removed, err)
		}
	}
	os.Exit(pgtest.Tests(m).Run())
}

// requireNetns skips t when this machine cannot build namespaces, and
// fails it instead under CI, which runs as root with iproute2 installed.
func requireNetns(t *testing.T) {
	t.Helper()
	if err := partition.Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v (CI runs as root with iproute2)", err)
		}
		t.Skipf("skipping: %v (run as root with iproute2)", err)
	}
}

// binaries returns the folder of lock-server and etcd-local
// (stack.CachedBinaries: built once for every package of the test run).
func binaries(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	dir, err := stack.CachedBinaries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// newNet returns a Net removed when t ends, whatever happens.
func newNet(t *testing.T, label string) *partition.Net {
	t.Helper()
	requireNetns(t)
	n, err := partition.New(t.Context(), label)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("remove namespaces: %v", err)
		}
	})
	return n
}

func addNodes(t *testing.T, n *partition.Net, labels ...string) []*partition.Node {
	t.Helper()
	var nodes []*partition.Node
	for _, l := range labels {
		node, err := n.Add(t.Context(), l)
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, node)
	}
	return nodes
}

// process is a child started inside a namespace, stopped when t ends
// (before its namespace is removed), its output in a log file that the
// test prints when it fails.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// start runs name inside node with env added to this process's, and
// returns once it runs; ready, when not nil, receives its stdout.
func start(t *testing.T, node *partition.Node, label string, env []string, stdout io.Writer, name string, args ...string) *process {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), label+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := node.Command(context.Background(), name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = logFile
	cmd.Stdout = logFile
	if stdout != nil {
		cmd.Stdout = stdout
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		t.Fatalf("start %s: %v", label, err)
	}
	p := &process{name: label, cmd: cmd, log: logPath, done: make(chan struct{})}
	// Ends when the child does; t's cleanup below makes sure it does.
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("%s log (tail):\n%s", label, b)
		}
	})
	return p
}

// stop kills the child's process group (nothing it would do on a clean
// shutdown matters to the tests) and waits for the child.
func (p *process) stop() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// httpFrom returns an HTTP client whose connections start in node.
func httpFrom(node *partition.Node, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext:         node.DialContext,
		MaxIdleConnsPerHost: 64,
	}}
}

// await calls f every 20 ms until it returns nil, or fails t after d.
func await(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := f()
		if err == nil {
			return
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("%s: not within %v: %v", what, d, err)
		}
	}
}

// etcdCluster starts a three-member etcd, one etcd-local process per
// member, each in its node, and returns the client URLs.
func etcdCluster(t *testing.T, nodes []*partition.Node) []string {
	t.Helper()
	bins := binaries(t)
	dir := t.TempDir()
	var hosts []string
	for _, n := range nodes {
		hosts = append(hosts, n.Addr)
	}
	if out, err := exec.Command(filepath.Join(bins, "etcd-local"), "-hosts", strings.Join(hosts, ","), "-dir", dir, "-prepare").CombinedOutput(); err != nil {
		t.Fatalf("etcd-local -prepare: %v\n%s", err, out)
	}
	readies := make([]chan error, len(nodes))
	for i, n := range nodes {
		pr, pw := io.Pipe()
		start(t, n, fmt.Sprintf("etcd-%d", i), nil, pw, filepath.Join(bins, "etcd-local"),
			"-members", strconv.Itoa(len(nodes)), "-dir", dir, "-member", strconv.Itoa(i))
		readies[i] = make(chan error, 1)
		// Ends at the child's first line, or when its stdout closes.
		go func() {
			_, err := bufio.NewReader(pr).ReadString('\n')
			readies[i] <- err
			_, _ = io.Copy(io.Discard, pr)
		}()
		t.Cleanup(func() { _ = pw.Close() })
	}
	for i, r := range readies {
		select {
		case err := <-r:
			if err != nil {
				t.Fatalf("etcd member %d: %v", i, err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("etcd member %d not ready within a minute", i)
		}
	}
	var urls []string
	for _, h := range hosts {
		urls = append(urls, fmt.Sprintf("http://%s:2379", h))
	}
	return urls
}

// etcdLeader returns the index of the member that leads, asked of every
// member from the client node through etcd's JSON gateway.
func etcdLeader(t *testing.T, from *partition.Node, urls []string) int {
	t.Helper()
	hc := httpFrom(from, 2*time.Second)
	leader := -1
	await(t, 30*time.Second, "etcd leader", func() error {
		for i, u := range urls {
			resp, err := hc.Post(u+"/v3/maintenance/status", "application/json", strings.NewReader("{}"))
			if err != nil {
				return err
			}
			var st struct {
				Header struct {
					MemberID string `json:"member_id"`
				} `json:"header"`
				Leader string `json:"leader"`
			}
			err = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			if err != nil {
				return err
			}
			if st.Leader != "" && st.Leader == st.Header.MemberID {
				leader = i
				return nil
			}
		}
		return errors.New("no member reports itself leader")
	})
	return leader
}

// lockServers starts one lock-server per node with env, each on port 8080
// of its node, and returns their URLs once each answers /readyz from the
// client node.
func lockServers(t *testing.T, from *partition.Node, nodes []*partition.Node, env ...string) []string {
	t.Helper()
	bins := binaries(t)
	var urls []string
	for i, n := range nodes {
		addr := n.Addr + ":8080"
		start(t, n, fmt.Sprintf("lock-server-%d", i), append([]string{
			config.EnvHTTPAddr + "=" + addr,
			config.EnvLogLevel + "=warn",
			// Each backend call gives up after a second: a refusal reaches
			// the caller well before its SDK's timeout.
			config.EnvRequestTimeoutMs + "=1000",
		}, env...), nil, filepath.Join(bins, "lock-server"))
		urls = append(urls, "http://"+addr)
	}
	hc := httpFrom(from, 2*time.Second)
	for _, u := range urls {
		await(t, 30*time.Second, u+" ready", func() error { return ready(hc, u) })
	}
	return urls
}

func ready(hc *http.Client, url string) error {
	resp, err := hc.Get(url + api.PathReady)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", api.PathReady, resp.Status)
	}
	return nil
}

// lockDB creates lockdb (migrated) in a throwaway PostgreSQL cluster, then
// runs that cluster's server inside node, listening on node's address, and
// returns lockdb's DSN there once it answers from node from.
func lockDB(t *testing.T, from, node *partition.Node) string {
	t.Helper()
	ctx := t.Context()
	c, err := pgcluster.Start(ctx, pgcluster.Config{})
	if errors.Is(err, pgcluster.ErrBinariesMissing) && os.Getenv("CI") != "true" {
		t.Skipf("skipping: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if err := c.CreateDatabase(ctx, "lockdb"); err != nil {
		t.Fatal(err)
	}
	if err := pgstore.Migrate(ctx, c.DSN("lockdb")); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(c.Dir(), "data")
	hba, err := os.OpenFile(filepath.Join(data, "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = fmt.Fprintf(hba, "host all all %s/16 trust\n", node.Addr)
	if err := errors.Join(err, hba.Close()); err != nil {
		t.Fatal(err)
	}
	binDir := os.Getenv(pgcluster.EnvBinDir)
	if binDir == "" {
		binDir = pgcluster.DefaultBinDir
	}
	start(t, node, "lockdb", []string{"LC_ALL=C"}, nil, "setpriv", "--reuid="+pgcluster.Superuser, "--regid="+pgcluster.Superuser, "--init-groups",
		filepath.Join(binDir, "postgres"), "-D", data, "-p", "5432", "-c", "listen_addresses="+node.Addr,
		"-c", "unix_socket_directories="+data, "-c", "fsync=on")
	dsn := fmt.Sprintf("postgres://%s@%s:5432/lockdb?sslmode=disable", pgcluster.Superuser, node.Addr)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DialFunc = from.DialContext
	await(t, 30*time.Second, "lockdb in its namespace", func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return err
		}
		return conn.Close(ctx)
	})
	return dsn
}
