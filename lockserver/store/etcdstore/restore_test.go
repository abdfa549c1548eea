package etcdstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"

	"github.com/distributed-lock-lab/distributed-lock-lab/etcd/embedded"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// saveSnapshot writes a snapshot of the cluster at endpoints to a file,
// as "etcdctl snapshot save" does (Maintenance.Snapshot).
func saveSnapshot(t *testing.T, endpoints []string) string {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	rc, err := cli.Snapshot(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	path := filepath.Join(t.TempDir(), "etcd.snapshot")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, rc); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// restoreInPlace stops nothing: given the stopped cluster's Dir, it gives
// the cluster a new --initial-cluster-token (so the restored cluster has a
// new ID, as a restore with other names, URLs or token has; token ""
// keeps the old one, and with it the cluster ID), replaces the
// member's data with "etcdutl snapshot restore" of snap (bumping the
// revision by bump when bump > 0), and starts the cluster again on the
// same URLs.
func restoreInPlace(t *testing.T, dir, snap, token string, bump uint64) *embedded.Cluster {
	t.Helper()
	layoutPath := filepath.Join(dir, "cluster.json")
	b, err := os.ReadFile(layoutPath)
	if err != nil {
		t.Fatal(err)
	}
	var lay struct {
		Token   string `json:"token"`
		Members []struct {
			Name      string `json:"name"`
			ClientURL string `json:"clientURL"`
			PeerURL   string `json:"peerURL"`
		} `json:"members"`
	}
	if err := json.Unmarshal(b, &lay); err != nil || len(lay.Members) != 1 {
		t.Fatalf("layout %s: %v %+v", layoutPath, err, lay)
	}
	if token != "" {
		lay.Token = token
	}
	if b, err = json.Marshal(lay); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(layoutPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	m := lay.Members[0]
	memberDir := filepath.Join(dir, m.Name)
	if err := os.RemoveAll(memberDir); err != nil {
		t.Fatal(err)
	}
	err = snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
		SnapshotPath:        snap,
		Name:                m.Name,
		OutputDataDir:       memberDir,
		PeerURLs:            []string{m.PeerURL},
		InitialCluster:      m.Name + "=" + m.PeerURL,
		InitialClusterToken: lay.Token,
		RevisionBump:        bump,
		MarkCompacted:       bump > 0,
	})
	if err != nil {
		t.Fatalf("etcdutl snapshot restore: %v", err)
	}
	return startT(t, embedded.Config{Dir: dir})
}

// grantRelease takes key and gives it back n times, returning the last token.
func grantRelease(t *testing.T, s *Store, key string, n int) int64 {
	t.Helper()
	var last int64
	for range n {
		l, err := s.Acquire(ctxT(t), key, "worker-a", 2*shared.MinLeaseTTL())
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		if err := s.Release(ctxT(t), key, "worker-a", l.Token); err != nil {
			t.Fatalf("Release: %v", err)
		}
		last = l.Token
	}
	return last
}

// TestSnapshotRestoreRefusesGrantsUntilAdvance takes a real snapshot of the
// cluster, grants more tokens, and restores the snapshot with etcdutl's
// restore into the member's data directory, on the same URLs, with a new
// cluster token, while the store (a running lock-server) stays open. The
// cluster has a new ID: the guard refuses every grant until advance, which
// needs no --bump-revision (it raises the token offset past N); then the
// next token is above every earlier one, from every lock-server.
func TestSnapshotRestoreRefusesGrantsUntilAdvance(t *testing.T) {
	dir := t.TempDir()
	c := startT(t, embedded.Config{Dir: dir})
	s := openT(t, c, newPrefix(t))
	defer s.Close()
	ctx := ctxT(t)
	grantRelease(t, s, "payout:acct-1", 3)
	// quiet is a second lock-server that grants nothing between the
	// restores and the operator's advance.
	quiet := openT(t, c, s.prefix)
	defer quiet.Close()
	grantRelease(t, quiet, "payout:acct-9", 1)
	// batched is a third lock-server, whose first grant after the restore
	// is a group grant.
	batched := openT(t, c, s.prefix)
	defer batched.Close()
	grantRelease(t, batched, "payout:acct-8", 1)
	held, err := s.Acquire(ctx, "payout:held", "worker-h", time.Minute) // live in the snapshot
	if err != nil {
		t.Fatal(err)
	}
	snap := saveSnapshot(t, c.Endpoints())
	highest := grantRelease(t, s, "payout:acct-1", 20) // issued after the snapshot
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	c = restoreInPlace(t, dir, snap, "restored-1", 0)
	// A group grant that finds the new cluster only after its transaction:
	// every member refused, every grant it made withdrawn.
	res := batched.AcquireMany(ctx, []store.AcquireRequest{
		{Key: "payout:acct-3", Owner: "worker-c", TTL: 2 * shared.MinLeaseTTL()}, {Key: "payout:acct-4", Owner: "worker-c", TTL: 2 * shared.MinLeaseTTL()}})
	for i, r := range res {
		if !errors.Is(r.Err, store.ErrBackendRestored) {
			t.Fatalf("group grant member %d on the restored cluster: %+v, %v; want ErrBackendRestored", i, r.Lease, r.Err)
		}
	}
	for _, key := range []string{"payout:acct-3", "payout:acct-4"} {
		if st, err := s.Inspect(ctx, key); err != nil || st.Lease != nil {
			t.Fatalf("Inspect(%s) after a refused group grant: %+v, %v; want no live lease (withdrawn)", key, st.Lease, err)
		}
	}
	for i := range 2 { // the first finds the new cluster after its grant, the second before
		l, err := s.Acquire(ctx, "payout:acct-2", "worker-b", 2*shared.MinLeaseTTL())
		switch {
		case err == nil && l.Token <= highest:
			t.Fatalf("acquire %d on the restored cluster re-issued token %d; %d was already issued before the restore", i, l.Token, highest)
		case err == nil:
			t.Fatalf("acquire %d on the restored cluster granted token %d; want ErrBackendRestored until advance", i, l.Token)
		case !errors.Is(err, store.ErrBackendRestored):
			t.Fatalf("acquire %d on the restored cluster: %v; want ErrBackendRestored", i, err)
		}
		t.Logf("acquire %d refused as it should be: %v", i, err)
	}
	// A handoff is a grant: refused like one, before its transaction
	// (the store knows of the new cluster now), and then nothing changed.
	_, err = s.Handoff(ctx, store.LeaseRef{Key: "payout:held", Owner: "worker-h", Token: held.Token},
		store.AcquireRequest{Key: "payout:held", Owner: "worker-b", TTL: time.Minute})
	if !errors.Is(err, store.ErrBackendRestored) {
		t.Fatalf("handoff on the restored cluster: %v; want ErrBackendRestored", err)
	}
	if st, err := s.Inspect(ctx, "payout:held"); err != nil || st.Lease == nil || st.Lease.Owner != "worker-h" || st.Lease.Token != held.Token {
		t.Fatalf("after the refused handoff: %+v, %v; want still worker-h's with token %d", st.Lease, err, held.Token)
	}
	if st, err := s.Inspect(ctx, "payout:acct-2"); err != nil || st.Lease != nil {
		t.Fatalf("Inspect after the refusals: %+v %v; want no live lease (the refused grant withdrawn)", st, err)
	}
	// The operator's lockctl is another client: s learns of the new stamp
	// from etcd. No --bump-revision is needed: advance raises the token
	// offset past N.
	op := openT(t, c, s.prefix)
	defer op.Close()
	adv, err := op.Advance(ctx, highest)
	if err != nil {
		t.Fatalf("Advance(%d) on the restored cluster: %v", highest, err)
	}
	if adv.NextAbove <= highest || adv.Previous == adv.Identity {
		t.Fatalf("Advance = %+v; want nextAbove > %d and a new identity", adv, highest)
	}
	l, err := s.Acquire(ctx, "payout:acct-2", "worker-b", 2*shared.MinLeaseTTL())
	if err != nil {
		t.Fatalf("Acquire after Advance: %v", err)
	}
	if l.Token <= highest {
		t.Fatalf("after Advance(%d) the grant has token %d", highest, l.Token)
	}
	// A lock-server that last granted before the restore grants above N at
	// once, and so does one opened now.
	if lq := grantRelease(t, quiet, "payout:acct-9", 1); lq <= highest {
		t.Fatalf("the quiet store's grant after Advance has token %d, not above %d", lq, highest)
	}
	if l2 := grantRelease(t, op, "payout:acct-3", 1); l2 <= l.Token {
		t.Fatalf("a new store's grant has token %d, not above %d", l2, l.Token)
	}
}

// steppedClock is lock-server's wall clock moved by a step the test sets,
// as a restore that takes a minute moves it.
type steppedClock struct{ step atomic.Int64 }

func (c *steppedClock) Now() time.Time { return time.Now().Add(time.Duration(c.step.Load())) }

// openClockT opens a store on c under prefix with clock clk.
func openClockT(t *testing.T, c *embedded.Cluster, prefix string, clk Clock) *Store {
	t.Helper()
	s, err := Open(ctxT(t), conf(func(cfg *Config) { cfg.Endpoints, cfg.Prefix, cfg.Clock = c.Endpoints(), prefix, clk }), nil)
	if err != nil {
		t.Fatalf("Open(%v, %q): %v", c.Endpoints(), prefix, err)
	}
	return s
}

// clusterIDT is the ID of the cluster s reaches.
func clusterIDT(t *testing.T, s *Store) uint64 {
	t.Helper()
	resp, err := s.cli.Get(ctxT(t), s.prefix, clientv3.WithCountOnly())
	if err != nil {
		t.Fatalf("read the cluster ID: %v", err)
	}
	return resp.Header.ClusterId
}

// memberDirT is the data directory of the one member of the cluster
// started in dir.
func memberDirT(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "cluster.json"))
	if err != nil {
		t.Fatal(err)
	}
	var lay struct {
		Members []struct {
			Name string `json:"name"`
		} `json:"members"`
	}
	if err := json.Unmarshal(b, &lay); err != nil || len(lay.Members) != 1 {
		t.Fatalf("layout in %s: %v %+v", dir, err, lay)
	}
	return filepath.Join(dir, lay.Members[0].Name)
}

// TestNoTokenIsIssuedTwiceAfterARollbackThatKeepsTheClusterID: etcd taken
// back, in the two ways that keep its cluster ID (so the restore guard's
// stamp still matches): a snapshot restored with etcdutl with the same
// member name, peer URL and cluster token, and the member's data
// directory copied while stopped and put back. Tokens were issued after
// the point it goes back to, through a lock-server that stays up and
// another replica; the restore takes a minute of lock-server's clock.
// Then the same lock-server, the other replica and one started after the
// rollback each grant, and every grant is above every token issued before
// the rollback, and above the grants before it.
func TestNoTokenIsIssuedTwiceAfterARollbackThatKeepsTheClusterID(t *testing.T) {
	rollbacks := []struct {
		name string
		// mark records the state to go back to, while c runs, and leaves a
		// cluster running; back stops it and starts it again from that
		// state.
		mark func(t *testing.T, dir string, c *embedded.Cluster) (back func() *embedded.Cluster)
	}{
		{"snapshot restored with the same names, URLs and token", func(t *testing.T, dir string, c *embedded.Cluster) func() *embedded.Cluster {
			snap := saveSnapshot(t, c.Endpoints())
			return func() *embedded.Cluster {
				if err := c.Close(); err != nil {
					t.Fatal(err)
				}
				return restoreInPlace(t, dir, snap, "", 0)
			}
		}},
		{"data directory put back", func(t *testing.T, dir string, c *embedded.Cluster) func() *embedded.Cluster {
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			saved := filepath.Join(t.TempDir(), "member")
			if err := os.CopyFS(saved, os.DirFS(memberDirT(t, dir))); err != nil {
				t.Fatal(err)
			}
			c = startT(t, embedded.Config{Dir: dir})
			return func() *embedded.Cluster {
				if err := c.Close(); err != nil {
					t.Fatal(err)
				}
				md := memberDirT(t, dir)
				if err := os.RemoveAll(md); err != nil {
					t.Fatal(err)
				}
				if err := os.CopyFS(md, os.DirFS(saved)); err != nil {
					t.Fatal(err)
				}
				return startT(t, embedded.Config{Dir: dir})
			}
		}},
	}
	for _, rb := range rollbacks {
		t.Run(rb.name, func(t *testing.T) {
			dir := t.TempDir()
			c := startT(t, embedded.Config{Dir: dir})
			clk := &steppedClock{}
			prefix := newPrefix(t)
			same := openClockT(t, c, prefix, clk)
			defer same.Close()
			other := openClockT(t, c, prefix, clk)
			defer other.Close()
			grantRelease(t, same, "payout:acct-1", 2)
			grantRelease(t, other, "payout:acct-2", 2)
			before := clusterIDT(t, same)

			back := rb.mark(t, dir, c)
			var highest int64
			for range 5 { // issued after the state the rollback goes back to
				highest = max(highest, grantRelease(t, same, "payout:acct-1", 3), grantRelease(t, other, "payout:acct-2", 3))
			}
			c = back()
			clk.step.Store(int64(time.Minute))
			if after := clusterIDT(t, same); after != before {
				t.Fatalf("the rollback changed the cluster ID from %s to %s; this test is about one that keeps it", clusterHex(before), clusterHex(after))
			}

			restarted := openClockT(t, c, prefix, clk)
			defer restarted.Close()
			last := highest
			for _, via := range []struct {
				name string
				s    *Store
			}{{"the same lock-server", same}, {"the other replica", other}, {"a restarted lock-server", restarted}} {
				for _, key := range []string{"payout:acct-1", "payout:acct-2"} {
					// Every path is tried, so that a failure names them all.
					l, err := via.s.Acquire(ctxT(t), key, "worker-b", 2*shared.MinLeaseTTL())
					switch {
					case err != nil:
						t.Errorf("%s: Acquire(%s) after the rollback: %v", via.name, key, err)
						continue
					case l.Token <= highest:
						t.Errorf("%s re-issued token %d for %s after the rollback; %d was already issued before it", via.name, l.Token, key, highest)
					case l.Token <= last:
						t.Errorf("%s granted token %d for %s; %d was granted before it", via.name, l.Token, key, last)
					}
					last = max(last, l.Token)
					if err := via.s.Release(ctxT(t), key, "worker-b", l.Token); err != nil {
						t.Fatalf("%s: Release(%s, %d): %v", via.name, key, l.Token, err)
					}
				}
			}
		})
	}
}

// TestConcurrentFirstStampsAllGrant: lock-servers that grant for the first
// time on a fresh prefix at once all write the restore guard's first stamp;
// the ones whose compare-and-swap loses to another's identical stamp must
// grant on it, not answer unavailable. Several rounds, since the losing
// interleaving is a matter of timing.
func TestConcurrentFirstStampsAllGrant(t *testing.T) {
	const stores, rounds = 4, 30
	cli, err := clientv3.New(clientv3.Config{Endpoints: shared.Endpoints(), Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer cli.Close()
	for round := range rounds {
		prefix := newPrefix(t)
		ss := make([]*Store, stores)
		for i := range ss {
			if ss[i], err = New(cli, conf(func(cfg *Config) { cfg.Prefix = prefix }), nil); err != nil {
				t.Fatalf("New: %v", err)
			}
			defer ss[i].Close()
		}
		start := make(chan struct{})
		errs := make(chan error, stores)
		for i, s := range ss {
			go func() {
				<-start
				_, err := s.Acquire(ctxT(t), fmt.Sprintf("payout:acct-%d", i), "worker", time.Minute)
				errs <- err
			}()
		}
		close(start)
		for range stores {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: a first grant on a fresh prefix: %v", round, err)
			}
		}
	}
}
