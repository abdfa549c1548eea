package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/distributed-lock-lab/distributed-lock-lab/etcd/embedded"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/etcdstore"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/pgstore"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestAdvanceLetsGrantsResumeAboveN: a lock-server on a lockdb whose
// identity stamp no longer matches (as after a restore; the restores
// themselves are tested in pgstore) answers acquire with 503
// BACKEND_RESTORED, which lockctl reports; "lockctl advance --past N"
// refuses bad input and changes nothing, then lets grants resume with
// tokens above N.
func TestAdvanceLetsGrantsResumeAboveN(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := pgtest.NewDatabase(t)
	pcfg := pgstore.DefaultConfig()
	pcfg.DSN = dsn
	lockStore, err := pgstore.Open(ctx, pcfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lockStore.Close()
	h, err := lockserver.NewServer(lockStore, lockserver.DefaultServerConfig(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	if _, err := runCmd(t, srv.URL, "acquire", "payout:acct-7", "--ttl", "1s"); err != nil {
		t.Fatal(err)
	}

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// What a restore into a new database does to the stamp's view.
	if _, err := conn.Exec(ctx, `UPDATE lockdb_identity SET database_oid = 0`); err != nil {
		t.Fatal(err)
	}
	_, err = runCmd(t, srv.URL, "acquire", "payout:acct-8")
	var ce *client.Error
	if !errors.Is(err, client.ErrBackendRestored) || !errors.As(err, &ce) || ce.Status != 503 || ce.Code != api.CodeBackendRestored {
		t.Fatalf("acquire on a restored lockdb: %v; want 503 BACKEND_RESTORED", err)
	}

	const n = 1_000
	for _, bad := range [][]string{
		{"advance", "--store", "postgres", "--lockdb-url", dsn},                               // no --past
		{"advance", "--store", "postgres", "--lockdb-url", dsn, "--past", "0"},                // not a token
		{"advance", "--store", "postgres", "--lockdb-url", dsn, "--past", "-5"},               // not a token
		{"advance", "--store", "postgres", "--lockdb-url", dsn, "--past", "1e9"},              // not an integer
		{"advance", "--store", "postgres", "--lockdb-url", dsn, "--past", "9007199254740992"}, // 2^53
		{"advance", "--store", "mysql", "--lockdb-url", dsn, "--past", "5"},
		{"advance", "--store", "postgres", "--lockdb-url", "", "--past", "5"},
		{"advance", "--store", "etcd", "--etcd-endpoints", " , ", "--past", "5"},
	} {
		if out, err := runCmd(t, srv.URL, bad...); err == nil {
			t.Fatalf("lockctl %s accepted: %s", strings.Join(bad, " "), out)
		}
	}
	if _, err := runCmd(t, srv.URL, "acquire", "payout:acct-8"); !errors.Is(err, client.ErrBackendRestored) {
		t.Fatalf("acquire after refused advances: %v; want still BACKEND_RESTORED", err)
	}

	out, err := runCmd(t, srv.URL, "advance", "--store", "postgres", "--lockdb-url", dsn, "--past", strconv.Itoa(n))
	if err != nil {
		t.Fatalf("advance: %v", err)
	}
	var adv store.Advanced
	if err := json.Unmarshal([]byte(out), &adv); err != nil || adv.Past != n || adv.NextAbove < n || adv.Identity == adv.Previous {
		t.Fatalf("advance printed %s (%v)", out, err)
	}
	out, err = runCmd(t, srv.URL, "acquire", "payout:acct-8")
	var g api.Grant
	if err != nil || json.Unmarshal([]byte(out), &g) != nil || g.Token <= n {
		t.Fatalf("acquire after advance: %s %v; want a token above %d", out, err, n)
	}
}

// TestAdvanceOnEtcdRaisesTheTokensPastN: on etcd, "lockctl advance"
// reaches the cluster through --etcd-endpoints and --etcd-prefix; with a
// stamp naming another cluster (as after a snapshot restore) grants are
// refused; advance stamps the cluster and raises the token offset, so
// grants resume above N, even an N far above the tokens issued so far (no
// --bump-revision needed).
func TestAdvanceOnEtcdRaisesTheTokensPastN(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := embedded.Start(ctx, embedded.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Cleanup(t, c.Close)
	const prefix = "/lockctl-test/locks/"
	ecfg := etcdstore.DefaultConfig()
	ecfg.Endpoints, ecfg.Prefix = c.Endpoints(), prefix
	lockStore, err := etcdstore.Open(ctx, ecfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lockStore.Close()
	l, err := lockStore.Acquire(ctx, "payout:acct-1", "worker-a", 2*time.Second) // stamps the cluster
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Put(ctx, prefix+"_restore_guard", `{"clusterId":"1"}`); err != nil {
		t.Fatal(err)
	}
	// A lock-server started now reads the stamp.
	lockStore, err = etcdstore.Open(ctx, ecfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lockStore.Close()
	if _, err := lockStore.Acquire(ctx, "payout:acct-2", "worker-a", 2*time.Second); !errors.Is(err, store.ErrBackendRestored) {
		t.Fatalf("acquire under a stamp of another cluster: %v; want ErrBackendRestored", err)
	}

	eps := strings.Join(c.Endpoints(), ",")
	n := l.Token + 3_600_000_000 // an hour of microseconds above the last token
	out, err := runCmd(t, "http://127.0.0.1:1", "advance", "--store", "etcd", "--etcd-endpoints", eps, "--etcd-prefix", prefix, "--past", strconv.FormatInt(n, 10))
	var adv store.Advanced
	if err != nil || json.Unmarshal([]byte(out), &adv) != nil || adv.NextAbove <= n {
		t.Fatalf("advance --past %d: %s %v; want nextAbove above it", n, out, err)
	}
	l2, err := lockStore.Acquire(ctx, "payout:acct-2", "worker-a", 2*time.Second)
	if err != nil || l2.Token <= adv.NextAbove {
		t.Fatalf("acquire after advance: %+v %v; want a token above %d", l2, err, adv.NextAbove)
	}
}
