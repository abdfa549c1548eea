package partition_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/harness/partition"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/config"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/servertest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/storetest"
)

// The partition tests run the contract suite's linearizability workload
// (storetest.CheckLinearizable: six clients, seeded, each bound to one
// lock-server replica, on two keys) while a fault cuts the network between
// real processes, each in a namespace of its own, and heals it. The fault
// also checks, from the side of the replica it cut off, that the replica
// refuses (503 with Retry-After) rather than grants, and that a replica on
// the majority side grants. After the run, porcupine has judged every
// answer against one correct lock (an answer cut off counts as unknown),
// and replicas.check that every grant's token is above those of the
// grants of its key answered before it was asked, that the cut-off replica
// granted nothing while cut off.

// TestEtcdMinorityPartition: one etcd member and the lock-server beside it
// cut off from the two other members and their lock-servers, with the raft
// leader on the cut-off side (it must step down, and the majority elect
// another) or on the majority side.
func TestEtcdMinorityPartition(t *testing.T) {
	for _, leaderCut := range []bool{true, false} {
		name := map[bool]string{true: "leader-in-minority", false: "leader-in-majority"}[leaderCut]
		t.Run(name, func(t *testing.T) {
			if !leaderCut && !*full {
				t.Skip("short set: run with -partitions.full (make partitions)")
			}
			e := etcdStack(t)
			leader := etcdLeader(t, e.client, e.etcdURLs)
			cut := (leader + 1) % 3
			if leaderCut {
				cut = leader
			}
			minority := []*partition.Node{e.etcd[cut], e.ls[cut]}
			var majority []*partition.Node
			for i := range 3 {
				if i != cut {
					majority = append(majority, e.etcd[i], e.ls[i])
				}
			}
			r := newReplicas(e.client, e.lsURLs)
			storetest.CheckLinearizable(t, "etcd-"+name, r, func() {
				isolate(t, e.net, r, cut, func(ctx context.Context) error { return e.net.Partition(ctx, minority, majority) })
			})
			r.check(t)
		})
	}
}

// TestAsymmetricPartitionEtcdCannotAnswerLockServer: lock-server 0 reaches
// every etcd member, but no member's packet reaches it: its requests may
// arrive and commit, their answers never come back. It must answer 503
// (outcome unknown to its callers), never a grant it could not confirm.
func TestAsymmetricPartitionEtcdCannotAnswerLockServer(t *testing.T) {
	if !*full {
		t.Skip("short set: run with -partitions.full (make partitions)")
	}
	e := etcdStack(t)
	r := newReplicas(e.client, e.lsURLs)
	storetest.CheckLinearizable(t, "etcd-asymmetric", r, func() {
		isolate(t, e.net, r, 0, func(ctx context.Context) error {
			for _, m := range e.etcd {
				if err := e.net.Cut(ctx, m, e.ls[0]); err != nil {
					return err
				}
			}
			return nil
		})
	})
	r.check(t)
}

// TestLockServerCutFromLockDB: lock-server 0 loses lockdb (PostgreSQL in a
// namespace of its own) while its callers still reach it; lock-server 1
// keeps lockdb.
func TestLockServerCutFromLockDB(t *testing.T) {
	if !*full {
		t.Skip("short set: run with -partitions.full (make partitions)")
	}
	n := newNet(t, "pg")
	nodes := addNodes(t, n, "cl", "db", "l0", "l1")
	cl, db, ls := nodes[0], nodes[1], nodes[2:]
	dsn := lockDB(t, cl, db)
	urls := lockServers(t, cl, ls, config.EnvStore+"=postgres", config.EnvLockDBURL+"="+dsn)
	r := newReplicas(cl, urls)
	storetest.CheckLinearizable(t, "lockdb-cut", r, func() {
		isolate(t, n, r, 0, func(ctx context.Context) error { return n.Partition(ctx, ls[:1], []*partition.Node{db}) })
	})
	r.check(t)
}

type etcdNet struct {
	net      *partition.Net
	client   *partition.Node
	etcd, ls []*partition.Node
	etcdURLs []string
	lsURLs   []string
}

// etcdStack starts three etcd members and three lock-servers over them,
// each process in a namespace of its own, and a namespace for the callers.
func etcdStack(t *testing.T) etcdNet {
	n := newNet(t, "etcd")
	nodes := addNodes(t, n, "cl", "e0", "e1", "e2", "l0", "l1", "l2")
	e := etcdNet{net: n, client: nodes[0], etcd: nodes[1:4], ls: nodes[4:7]}
	e.etcdURLs = etcdCluster(t, e.etcd)
	e.lsURLs = lockServers(t, e.client, e.ls, config.EnvStore+"=etcd", config.EnvEtcdEndpoints+"="+strings.Join(e.etcdURLs, ","))
	return e
}

// isolate is the fault: it cuts replica cut off (with cutFn), checks that
// the replica refuses and another grants, and heals. It reports failures
// with t.Error: it runs beside the workload.
func isolate(t *testing.T, n *partition.Net, r *replicas, cut int, cutFn func(context.Context) error) {
	ctx := context.Background()
	if err := cutFn(ctx); err != nil {
		t.Error(err)
		return
	}
	r.cutOff(cut)
	defer func() {
		r.healed()
		if err := n.Heal(ctx); err != nil {
			t.Error(err)
		}
	}()
	refuses(t, r.from, r.urls[cut])
	grants(t, r.from, r.urls[(cut+1)%len(r.urls)])
	// Keep the cut while the callers of the other replicas go on, until
	// they have been granted want leases (or limit has passed: they may
	// have finished their calls).
	// A paused call keeps its context (storetest's 15 s per call): the
	// whole cut stays well within it.
	want, limit := 5, 3*time.Second
	if *full {
		want, limit = 40, 8*time.Second
	}
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for r.grantsSinceCut() < want && time.Now().Before(deadline) {
		<-tick.C
	}
}

// refuses asks url for a lease and wants a 503 with Retry-After.
func refuses(t *testing.T, from *partition.Node, url string) {
	hc := httpFrom(from, 10*time.Second)
	body := strings.NewReader(`{"owner":"probe","ttlMs":60000}`)
	start := time.Now()
	resp, err := hc.Post(url+api.PathLockPrefix+"partition-probe"+api.SuffixAcquire, "application/json", body)
	if err != nil {
		t.Errorf("cut-off replica %s: %v; want a 503 answer", url, err)
		return
	}
	defer resp.Body.Close()
	var env api.ErrorEnvelope
	_ = json.NewDecoder(resp.Body).Decode(&env)
	ra, raErr := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != http.StatusServiceUnavailable || raErr != nil || ra < 1 {
		t.Errorf("cut-off replica %s answered %s (code %s, Retry-After %q); want 503 with Retry-After",
			url, resp.Status, env.Error.Code, resp.Header.Get("Retry-After"))
		return
	}
	t.Logf("cut-off replica refused in %v: %s %s, Retry-After %ds", time.Since(start).Round(time.Millisecond), resp.Status, env.Error.Code, ra)
}

// grants wants url to grant a lease within 20 s (an election may come
// first), and releases it.
func grants(t *testing.T, from *partition.Node, url string) {
	c, err := client.New(url, client.WithHTTPClient(httpFrom(from, 0)), client.WithOwner("probe"))
	if err != nil {
		t.Error(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	for {
		l, err := c.TryAcquire(ctx, "partition-probe-majority", client.WithTTL(5*time.Second))
		if err == nil {
			t.Logf("majority replica granted token %d in %v", l.Token(), time.Since(start).Round(time.Millisecond))
			_ = l.Release(ctx)
			return
		}
		if !errors.Is(err, client.ErrUnavailable) || ctx.Err() != nil {
			t.Errorf("majority replica %s: %v; want a grant", url, err)
			return
		}
	}
}

// replicas is a LockStore over several lock-server replicas: the client
// "client-N" talks to replica N modulo their number, revoke and inspect
// (no owner) go round robin. It records every grant and every grant made
// by the cut-off replica while it was cut off.
type replicas struct {
	from   *partition.Node
	urls   []string
	stores []store.LockStore
	rr     atomic.Uint64

	mu      sync.Mutex
	cut     int // -1: none
	cutAt   time.Time
	healAt  time.Time
	heal    chan struct{} // closed at healAt
	grants  []grant
	illegal []string
	refused map[int]int // unknown outcomes per replica while cut
}

type grant struct {
	key       string
	token     int64
	call, ret time.Time
}

var _ store.LockStore = (*replicas)(nil)

func newReplicas(from *partition.Node, urls []string) *replicas {
	r := &replicas{from: from, urls: urls, cut: -1, refused: map[int]int{}}
	for _, u := range urls {
		// No drift allowance: the workload checks the server's answers,
		// and its grants (ten minutes) never come near a deadline.
		c, err := client.New(u, client.WithHTTPClient(httpFrom(from, 0)), client.WithDriftAllowance(0, 0))
		if err != nil {
			panic(err) // only an invalid option fails New
		}
		r.stores = append(r.stores, servertest.Remote(c))
	}
	return r
}

// AbandonsUnknownGrants: lock-server releases, in the background, a grant
// whose caller never got it (storetest models that).
func (r *replicas) AbandonsUnknownGrants() {}

func (r *replicas) cutOff(i int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cut, r.cutAt, r.heal = i, time.Now(), make(chan struct{})
}

func (r *replicas) healed() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.healAt = time.Now()
	close(r.heal)
}

// pause holds a call to replica i while i is cut off and has already
// answered a call with an unknown outcome: its caller backs off until the
// heal, as a caller told Retry-After would, rather than pile up calls of
// unknown outcome (each one widens porcupine's search).
func (r *replicas) pause(ctx context.Context, i int) {
	r.mu.Lock()
	heal, paused := r.heal, r.cut == i && r.healAt.IsZero() && r.refused[i] > 0
	r.mu.Unlock()
	if paused {
		select {
		case <-heal:
		case <-ctx.Done():
		}
	}
}

func (r *replicas) grantsSinceCut() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, g := range r.grants {
		if g.call.After(r.cutAt) {
			n++
		}
	}
	return n
}

// anyReplica picks the replica of a call that names no owner: round robin,
// past the cut-off one once it has refused (the caller knows better).
func (r *replicas) anyReplica() int {
	for {
		i := int(r.rr.Add(1) % uint64(len(r.stores)))
		r.mu.Lock()
		skip := r.cut == i && r.healAt.IsZero() && r.refused[i] > 0
		r.mu.Unlock()
		if !skip {
			return i
		}
	}
}

func (r *replicas) byOwner(owner string) int {
	n, _ := strconv.Atoi(owner[strings.LastIndexByte(owner, '-')+1:])
	return n % len(r.stores)
}

// record notes the answer of replica i to a call made at call.
func (r *replicas) record(i int, op, key string, token int64, call time.Time, err error) {
	ret := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	cutOff := r.cut == i && call.After(r.cutAt) && (r.healAt.IsZero() || ret.Before(r.healAt))
	if err == nil && op == "acquire" {
		r.grants = append(r.grants, grant{key: key, token: token, call: call, ret: ret})
	}
	if cutOff && err == nil && (op == "acquire" || op == "renew") {
		r.illegal = append(r.illegal, fmt.Sprintf("cut-off replica %d answered %s %s with token %d", i, op, key, token))
	}
	if !r.cutAt.IsZero() && r.healAt.IsZero() && errors.Is(err, store.ErrUnavailable) {
		r.refused[i]++
	}
}

func (r *replicas) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (store.Lease, error) {
	i := r.byOwner(owner)
	r.pause(ctx, i)
	call := time.Now()
	l, err := r.stores[i].Acquire(ctx, key, owner, ttl)
	r.record(i, "acquire", key, l.Token, call, err)
	return l, err
}

func (r *replicas) Renew(ctx context.Context, key, owner string, token int64) (store.Lease, error) {
	i := r.byOwner(owner)
	r.pause(ctx, i)
	call := time.Now()
	l, err := r.stores[i].Renew(ctx, key, owner, token)
	r.record(i, "renew", key, token, call, err)
	return l, err
}

func (r *replicas) Release(ctx context.Context, key, owner string, token int64) error {
	i := r.byOwner(owner)
	r.pause(ctx, i)
	call := time.Now()
	err := r.stores[i].Release(ctx, key, owner, token)
	r.record(i, "release", key, token, call, err)
	return err
}

func (r *replicas) Revoke(ctx context.Context, key string, token int64) (store.Lease, error) {
	i := r.anyReplica()
	r.pause(ctx, i)
	call := time.Now()
	l, err := r.stores[i].Revoke(ctx, key, token)
	r.record(i, "revoke", key, token, call, err)
	return l, err
}

func (r *replicas) Inspect(ctx context.Context, key string) (store.State, error) {
	i := r.anyReplica()
	r.pause(ctx, i)
	call := time.Now()
	st, err := r.stores[i].Inspect(ctx, key)
	r.record(i, "inspect", key, 0, call, err)
	return st, err
}

// Ping succeeds when every replica but the cut-off one is ready (a call
// to that one waits for the heal in pause).
func (r *replicas) Ping(ctx context.Context) error {
	r.mu.Lock()
	cut := r.cut
	if !r.healAt.IsZero() {
		cut = -1
	}
	r.mu.Unlock()
	for i, s := range r.stores {
		if i == cut {
			continue
		}
		if err := s.Ping(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (r *replicas) Close() error { return nil }

// check fails t for a grant by the cut-off replica while cut off, and for
// a grant whose token is not above that of a grant of its key answered
// before it was asked for (or equal to any other's).
func (r *replicas) check(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cutAt.IsZero() || r.healAt.IsZero() {
		t.Fatal("the fault never cut the network")
	}
	for _, s := range r.illegal {
		t.Error(s)
	}
	byKey := map[string][]grant{}
	for _, g := range r.grants {
		byKey[g.key] = append(byKey[g.key], g)
	}
	for key, gs := range byKey {
		seen := map[int64]bool{}
		for _, a := range gs {
			if seen[a.token] {
				t.Errorf("%s: token %d granted twice", key, a.token)
			}
			seen[a.token] = true
			for _, b := range gs {
				if a.ret.Before(b.call) && a.token >= b.token {
					t.Errorf("%s: token %d granted after token %d was answered", key, b.token, a.token)
				}
			}
		}
	}
	during := 0
	for _, g := range r.grants {
		if g.call.After(r.cutAt) && g.ret.Before(r.healAt) {
			during++
		}
	}
	t.Logf("%d grants, %d of them while cut; cut for %v; calls with unknown outcome while cut, per replica: %v",
		len(r.grants), during, r.healAt.Sub(r.cutAt).Round(time.Millisecond), r.refused)
}
