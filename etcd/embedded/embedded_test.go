package embedded

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func startT(t *testing.T, cfg Config) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("Start(%+v): %v", cfg, err)
	}
	// Closed at the end of the test, or at once on Ctrl-C: no data
	// directory is left behind either way.
	pgtest.Cleanup(t, c.Close)
	return c
}

func clientT(t *testing.T, c *Cluster) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// putRetry retries a put on errors while a member (re)joins or a leader is
// elected; it fails the test when the context ends first.
func putRetry(t *testing.T, cli *clientv3.Client, key, val string) *clientv3.PutResponse {
	t.Helper()
	ctx := ctxT(t)
	for {
		opCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := cli.Put(opCtx, key, val)
		cancel()
		if err == nil {
			return resp
		}
		if ctx.Err() != nil {
			t.Fatalf("Put(%q): %v", key, err)
		}
	}
}

func TestConfigDefaultsAndLeaseFloor(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("zero Config: %v", err)
	}
	for _, tc := range []struct {
		cfg  Config
		want time.Duration
	}{
		{Config{}, time.Second},
		{Config{Heartbeat: 100 * time.Millisecond, ElectionTimeout: time.Second}, 2 * time.Second}, // etcd's own defaults
		{Config{Heartbeat: 100 * time.Millisecond, ElectionTimeout: 600 * time.Millisecond}, time.Second},
	} {
		if got := tc.cfg.MinLeaseTTL(); got != tc.want {
			t.Errorf("%+v.MinLeaseTTL() = %v; want %v", tc.cfg, got, tc.want)
		}
	}
	for _, bad := range []Config{
		{Members: -1}, {Members: MaxMembers + 1},
		{Heartbeat: 100 * time.Millisecond, ElectionTimeout: 400 * time.Millisecond},
		{Heartbeat: 1500 * time.Microsecond},
		{StartAttempts: -1},
	} {
		if err := bad.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v.Validate() = %v; want ErrInvalidConfig", bad, err)
		}
	}
	// Every invalid field at once, not only the first.
	err := (Config{Members: -1, StartAttempts: -1}).Validate()
	if err == nil || !strings.Contains(err.Error(), "members") || !strings.Contains(err.Error(), "start attempts") {
		t.Errorf("Validate(members -1, start attempts -1) = %v; want both named", err)
	}
}

func TestSingleMemberRestartKeepsDataAndRevisionGrows(t *testing.T) {
	c := startT(t, Config{})
	cli := clientT(t, c)
	before := putRetry(t, cli, "/k", "v1")

	if err := c.StopMember(0); err != nil {
		t.Fatalf("StopMember: %v", err)
	}
	if err := c.StopMember(0); !errors.Is(err, ErrMemberStopped) {
		t.Fatalf("second StopMember = %v; want ErrMemberStopped", err)
	}
	if m, _ := c.Member(0); m.Running {
		t.Fatalf("Member(0).Running after stop = true")
	}
	if err := c.RestartMember(ctxT(t), 0); err != nil {
		t.Fatalf("RestartMember: %v", err)
	}
	if err := c.RestartMember(ctxT(t), 0); !errors.Is(err, ErrMemberRunning) {
		t.Fatalf("second RestartMember = %v; want ErrMemberRunning", err)
	}

	after := putRetry(t, cli, "/k2", "v2")
	if after.Header.Revision <= before.Header.Revision {
		t.Fatalf("revision after restart = %d; want > %d", after.Header.Revision, before.Header.Revision)
	}
	got, err := cli.Get(ctxT(t), "/k")
	if err != nil {
		t.Fatalf("Get after restart: %v", err)
	}
	if len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "v1" || got.Kvs[0].ModRevision != before.Header.Revision {
		t.Fatalf("Get(/k) after restart = %v; want v1 at revision %d", got.Kvs, before.Header.Revision)
	}
}

func TestLeaseFloorIsOneSecond(t *testing.T) {
	c := startT(t, Config{})
	cli := clientT(t, c)
	resp, err := cli.Grant(ctxT(t), 1)
	if err != nil {
		t.Fatalf("Grant(1s): %v", err)
	}
	if resp.TTL != 1 {
		t.Fatalf("granted TTL = %ds; want 1s (floor %v)", resp.TTL, c.MinLeaseTTL())
	}
}

func TestThreeMembersServeWritesWithOneStopped(t *testing.T) {
	c := startT(t, Config{Members: 3})
	if n := len(c.Endpoints()); n != 3 {
		t.Fatalf("%d endpoints; want 3", n)
	}
	cli := clientT(t, c)
	first := putRetry(t, cli, "/a", "1")

	leader, err := c.Leader()
	if err != nil {
		t.Fatalf("Leader: %v", err)
	}
	stopped := (leader + 1) % 3 // a follower; the leader case is in etcdstore's tests
	if err := c.StopMember(stopped); err != nil {
		t.Fatalf("StopMember(%d): %v", stopped, err)
	}
	for i := 0; i < 5; i++ {
		resp := putRetry(t, cli, fmt.Sprintf("/b%d", i), "2")
		if resp.Header.Revision <= first.Header.Revision {
			t.Fatalf("revision %d with a member stopped; want > %d", resp.Header.Revision, first.Header.Revision)
		}
	}
	if err := c.RestartMember(ctxT(t), stopped); err != nil {
		t.Fatalf("RestartMember(%d): %v", stopped, err)
	}
}

func TestOwnedDirIsReusedWithSameURLs(t *testing.T) {
	dir := t.TempDir()
	c1, err := Start(ctxT(t), Config{Dir: dir})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	cli := clientT(t, c1)
	put := putRetry(t, cli, "/persist", "yes")
	eps := c1.Endpoints()
	if err := c1.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	c2 := startT(t, Config{Dir: dir})
	if fmt.Sprint(c2.Endpoints()) != fmt.Sprint(eps) {
		t.Fatalf("endpoints after restart from %s = %v; want %v", dir, c2.Endpoints(), eps)
	}
	got, err := clientT(t, c2).Get(ctxT(t), "/persist")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if len(got.Kvs) != 1 || got.Kvs[0].ModRevision != put.Header.Revision {
		t.Fatalf("Get(/persist) = %v; want the key written before the restart", got.Kvs)
	}
	if _, err := Start(ctxT(t), Config{Dir: dir, Members: 3}); !errors.Is(err, ErrLayoutMismatch) {
		t.Fatalf("Start with 3 members on a 1-member dir = %v; want ErrLayoutMismatch", err)
	}
}

func TestBadMemberIndex(t *testing.T) {
	c := startT(t, Config{})
	if _, err := c.Member(1); !errors.Is(err, ErrNoSuchMember) {
		t.Errorf("Member(1) = %v; want ErrNoSuchMember", err)
	}
	if err := c.StopMember(-1); !errors.Is(err, ErrNoSuchMember) {
		t.Errorf("StopMember(-1) = %v; want ErrNoSuchMember", err)
	}
}

func TestKilledLeaderIsReplaced(t *testing.T) {
	c := startT(t, Config{Members: 3})
	cli := clientT(t, c)
	first := putRetry(t, cli, "/a", "1")
	leader, err := c.Leader()
	if err != nil {
		t.Fatalf("Leader: %v", err)
	}
	if err := c.KillMember(leader); err != nil {
		t.Fatalf("KillMember(%d): %v", leader, err)
	}
	if err := c.KillMember(leader); !errors.Is(err, ErrMemberStopped) {
		t.Fatalf("second KillMember = %v; want ErrMemberStopped", err)
	}
	after := putRetry(t, cli, "/b", "2")
	if after.Header.Revision <= first.Header.Revision {
		t.Fatalf("revision after the leader was killed = %d; want > %d", after.Header.Revision, first.Header.Revision)
	}
	if now, err := c.Leader(); err != nil || now == leader {
		t.Fatalf("Leader after kill = %d, %v; want another member", now, err)
	}
	if err := c.RestartMember(ctxT(t), leader); err != nil {
		t.Fatalf("RestartMember(%d): %v", leader, err)
	}
	got, err := cli.Get(ctxT(t), "/a")
	if err != nil || len(got.Kvs) != 1 {
		t.Fatalf("Get(/a) after restart = %v, %v", got, err)
	}
}

// One Cluster per member (Only) over a prepared Dir forms one
// three-member cluster, as three etcd-local processes do: every member
// sees the same leader, and a write through one is read through another.
// Without PrepareDir, Only is refused.
func TestOneClusterPerMemberFormOneCluster(t *testing.T) {
	dir := t.TempDir()
	if _, err := Start(t.Context(), Config{Members: 3, Dir: dir, Only: []int{0}}); !errors.Is(err, ErrLayoutMismatch) {
		t.Fatalf("Start with Only before PrepareDir = %v; want ErrLayoutMismatch", err)
	}
	if err := PrepareDir(dir, 3); err != nil {
		t.Fatal(err)
	}
	if err := PrepareDir(dir, 3); !errors.Is(err, ErrLayoutMismatch) {
		t.Fatalf("second PrepareDir = %v; want ErrLayoutMismatch", err)
	}
	cs := make([]*Cluster, 3)
	errs := make([]error, 3)
	done := make(chan struct{})
	for i := range cs {
		go func() {
			defer func() { done <- struct{}{} }()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			cs[i], errs[i] = Start(ctx, Config{Members: 3, Dir: dir, Only: []int{i}})
		}()
	}
	for range cs {
		<-done
	}
	for i, c := range cs {
		if errs[i] != nil {
			t.Fatalf("member %d: %v", i, errs[i])
		}
		pgtest.Cleanup(t, c.Close)
	}
	leaders := map[int]bool{}
	for i, c := range cs {
		l, err := c.Leader()
		if err == nil {
			leaders[l] = true
		}
		if m, _ := c.Member((i + 1) % 3); m.Running {
			t.Errorf("cluster %d runs member %d too", i, (i+1)%3)
		}
	}
	if len(leaders) != 1 {
		t.Errorf("leaders seen %v; want exactly one member leading", leaders)
	}
	cli := clientT(t, cs[0])
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	cli2, err := clientv3.New(clientv3.Config{Endpoints: []string{cs[2].Endpoints()[2]}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli2.Close()
	got, err := cli2.Get(ctx, "k")
	if err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "v" {
		t.Errorf("read through member 2 = %v, %v; want k=v", got, err)
	}
}

// PrepareDirHosts gives member i the address hosts[i] on etcd's ports,
// and refuses what is not an IP address.
func TestPrepareDirHostsOneAddressPerMember(t *testing.T) {
	dir := t.TempDir()
	if err := PrepareDirHosts(dir, []string{"10.77.1.2", "10.77.2.2", "10.77.3.2"}); err != nil {
		t.Fatal(err)
	}
	c := &Cluster{dir: dir, cfg: Config{Members: 3}}
	lay, ok, err := c.readLayout()
	if err != nil || !ok {
		t.Fatalf("readLayout = %v, %v", ok, err)
	}
	for i, want := range []string{"http://10.77.1.2:2379", "http://10.77.2.2:2379", "http://10.77.3.2:2379"} {
		if got := lay.Members[i].ClientURL; got != want {
			t.Errorf("member %d client URL %s; want %s", i, got, want)
		}
	}
	if got, want := lay.Members[2].PeerURL, "http://10.77.3.2:2380"; got != want {
		t.Errorf("member 2 peer URL %s; want %s", got, want)
	}
	if err := PrepareDirHosts(t.TempDir(), []string{"10.77.1.2", "lock-server"}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("a host name: %v; want ErrInvalidConfig", err)
	}
}

// TestStartReturnsOnceServing: once Start returns, no goroutine of a
// member's start still reads os.Stderr (go test -json replaces it as the
// tests begin, which the race detector reported against etcd's client
// handler setup). Run with -race: the write below is what testing does.
func TestStartReturnsOnceServing(t *testing.T) {
	startT(t, Config{})
	stderr := os.Stderr
	os.Stderr = stderr
}
