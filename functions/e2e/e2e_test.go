package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/distributed-lock-lab/distributed-lock-lab/etcd/embedded"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutaudit"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutbus"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgpool"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/etcdstore"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/pgstore"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var fullMatrix = flag.Bool("matrix.full", false, "run every case of each matrix on both lock backends (make test-full), not each case on one")

// backendsOf returns the lock backends case i of a matrix runs on: both
// with -matrix.full; else one, alternating with i, so that every matrix of
// more than one case still runs on both backends.
func backendsOf(i int) []string {
	backends := []string{"postgres", "etcd"}
	if *fullMatrix {
		return backends
	}
	return backends[i%2 : i%2+1]
}

const (
	accounts     = 20
	payouts      = 200
	openingMinor = 100_000_000
	seed         = 7 // drives amounts and the duplication of deliveries
)

// logger writes JSON logs to a file per test, kept when the test fails.
func logger(t *testing.T) *slog.Logger {
	t.Helper()
	f, err := os.CreateTemp("", "e2e-*.log")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.Close()
		if t.Failed() {
			t.Logf("service logs kept in %s", f.Name())
			return
		}
		os.Remove(f.Name())
	})
	return slog.New(slog.NewJSONHandler(f, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func serveHTTP(t *testing.T, h http.Handler) string {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s.URL
}

func postJSON(t *testing.T, url string, body any) int {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	return resp.StatusCode
}

// roundRobin spreads push requests over several executors, as Cloud Run
// spreads them over instances, and counts them.
type roundRobin struct {
	workers []http.Handler
	next    atomic.Int64
}

func (rr *roundRobin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rr.workers[int(rr.next.Add(1))%len(rr.workers)].ServeHTTP(w, r)
}

// begin skips t in -short mode (what names what the test starts) and
// returns a context that ends after limit, or with t.
func begin(t *testing.T, what string, limit time.Duration) context.Context {
	t.Helper()
	if testing.Short() {
		t.Skip("starts " + what)
	}
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	t.Cleanup(cancel)
	return ctx
}

// TestPayoutPipelineEndToEnd runs the pipeline over PostgreSQL, and over
// etcd too with -matrix.full (make test-full); harness/soak's short crash
// soak runs it over both on real processes.
func TestPayoutPipelineEndToEnd(t *testing.T) {
	ctx := begin(t, "PostgreSQL, etcd and Pub/Sub", 8*time.Minute)
	stores := lockStores(ctx, t)
	for _, backend := range backendsOf(0) {
		t.Run(backend, func(t *testing.T) { runPipeline(ctx, t, stores[backend]) })
	}
}

// lockStores returns, per backend name, a function opening a fresh lock
// store: a new lockdb database, or a new key prefix on an embedded etcd,
// started for t on first use.
func lockStores(ctx context.Context, outer *testing.T) map[string]func(*testing.T, *slog.Logger) store.LockStore {
	outer.Helper()
	var (
		etcdOnce sync.Once
		cluster  *embedded.Cluster
		etcdErr  error
	)
	return map[string]func(*testing.T, *slog.Logger) store.LockStore{
		"postgres": func(t *testing.T, log *slog.Logger) store.LockStore {
			scfg := pgstore.DefaultConfig()
			scfg.DSN = pgtest.NewDatabase(t)
			s, err := pgstore.Open(ctx, scfg, log)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"etcd": func(t *testing.T, log *slog.Logger) store.LockStore {
			etcdOnce.Do(func() {
				if cluster, etcdErr = embedded.Start(ctx, embedded.Config{}); etcdErr == nil {
					pgtest.Cleanup(outer, cluster.Close)
				}
			})
			if etcdErr != nil {
				t.Fatal(etcdErr)
			}
			prefix := "/" + strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()) + "/"
			scfg := etcdstore.DefaultConfig()
			scfg.Endpoints, scfg.Prefix = cluster.Endpoints(), prefix
			s, err := etcdstore.Open(ctx, scfg, log)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	}
}

// stack is one pipeline: lock-server over a store, rail-stub, rail-proxy,
// payment-resource and Pub/Sub, each on a loopback test server.
type stack struct {
	store   store.LockStore
	stub    *railstub.Stub
	lockURL string
	proxy   string
	pay     string
	paydb   string
	raildb  string
	psc     *pubsub.Client
}

// fences selects the two kill switches.
type fences struct{ payment, rail bool }

func newStack(ctx context.Context, t *testing.T, log *slog.Logger, openStore func(*testing.T, *slog.Logger) store.LockStore, f fences) *stack {
	t.Helper()
	st := &stack{store: openStore(t, log)}
	t.Cleanup(func() { st.store.Close() })
	lcfg := lockserver.DefaultServerConfig()
	lcfg.ProofKey = fencingtest.LockSigningKey()
	ls, err := lockserver.NewServer(st.store, lcfg, log.With("service", "lock-server"))
	if err != nil {
		t.Fatal(err)
	}
	st.lockURL = serveHTTP(t, ls)

	st.stub, err = railstub.New(railstub.DefaultConfig(), log.With("service", "rail-stub"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.stub.Close() })
	pcfg := railproxy.DefaultConfig()
	st.raildb = pgtest.NewDatabase(t)
	pcfg.DB = pgpool.Config{DSN: st.raildb}
	pcfg.RailURL = serveHTTP(t, st.stub)
	pcfg.FencingDisabled = !f.rail
	pcfg.ProofKeys, pcfg.ReceiptKey = fencingtest.ProofKeys(), fencingtest.ReceiptSigningKey()
	pcfg.TermsKeys = fencingtest.TermsKeys()
	proxy, err := railproxy.New(ctx, pcfg, log.With("service", "rail-proxy"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	st.proxy = serveHTTP(t, proxy)

	ps := pstest.NewServer()
	t.Cleanup(func() { ps.Close() })
	conn, err := grpc.NewClient(ps.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	st.psc, err = pubsub.NewClient(ctx, "local", option.WithGRPCConn(conn))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.psc.Close() })
	if err := payoutbus.Setup(ctx, st.psc, "local", "payouts", "payout-executor", 60*time.Second); err != nil {
		t.Fatal(err)
	}
	pub := payoutbus.NewPublisher(st.psc, "payouts")
	t.Cleanup(pub.Stop)

	st.paydb = pgtest.NewDatabase(t)
	paycfg := paymentresource.DefaultConfig()
	paycfg.DatabaseURL, paycfg.OutboxPoll, paycfg.FencingDisabled = st.paydb, 50*time.Millisecond, !f.payment
	paycfg.ProofKeys, paycfg.ReceiptKeys = fencingtest.ProofKeys(), fencingtest.ReceiptKeys()
	paycfg.TermsKey = fencingtest.TermsSigningKey()
	svc, err := paymentresource.New(ctx, paycfg, pub, log.With("service", "payment-resource"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	st.pay = serveHTTP(t, svc.Handler())
	return st
}

// audit runs the cross-record audit (payoutaudit) over the stack's rail
// journal, raildb and the paydb behind pool.
func (st *stack) audit(ctx context.Context, t *testing.T, pool *pgxpool.Pool) payoutaudit.Report {
	t.Helper()
	raildb, err := pgxpool.New(ctx, st.raildb)
	if err != nil {
		t.Fatal(err)
	}
	defer raildb.Close()
	rep, err := payoutaudit.Run(ctx, pool, raildb, st.stub.Submissions(""), nil)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// executor returns a worker of the stack named owner, with leases of ttl.
func (st *stack) executor(t *testing.T, log *slog.Logger, owner string, ttl time.Duration, opts ...executor.Option) *executor.Executor {
	t.Helper()
	cfg := executor.DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL = st.lockURL, st.pay, st.proxy
	cfg.Owner = owner
	cfg.LeaseTTL = ttl
	cfg.AcquireWait = 30 * time.Second
	x, err := executor.New(cfg, log.With("service", "executor", "worker", owner), opts...)
	if err != nil {
		t.Fatal(err)
	}
	// Its lease releases follow the push answers: wait for the last ones.
	t.Cleanup(func() { _ = x.Close(context.Background()) })
	return x
}

func runPipeline(ctx context.Context, t *testing.T, openStore func(*testing.T, *slog.Logger) store.LockStore) {
	log := logger(t)
	rng := rand.New(rand.NewPCG(seed, seed))
	st := newStack(ctx, t, log, openStore, fences{payment: true, rail: true})
	stub, payURL := st.stub, st.pay

	// three executors behind one push endpoint
	rr := &roundRobin{}
	for i := range 3 {
		rr.workers = append(rr.workers, st.executor(t, log, fmt.Sprintf("executor-%d", i), executor.DefaultConfig().LeaseTTL))
	}
	pushURL := serveHTTP(t, rr)
	var copiesMu sync.Mutex
	bridge := &payoutbus.PushBridge{
		Sub: st.psc.Subscriber("payout-executor"), Admin: st.psc.SubscriptionAdminClient, Endpoint: pushURL, Log: log.With("service", "push-bridge"),
		// Every delivery arrives two or three times, half of them at once.
		Copies: func(string) (int, bool) {
			copiesMu.Lock()
			defer copiesMu.Unlock()
			return 2 + rng.IntN(2), rng.IntN(2) == 0
		},
	}
	bctx, stopBridge := context.WithCancel(ctx)
	bridgeDone := make(chan error, 1)
	go func() { bridgeDone <- bridge.Run(bctx) }()
	defer func() {
		stopBridge()
		if err := <-bridgeDone; err != nil {
			t.Errorf("push bridge: %v", err)
		}
	}()

	// The workload: accounts, then payouts, through payment-resource's API.
	amounts := map[string]int64{}
	for a := range accounts {
		if code := postJSON(t, payURL+api.PathAccounts, map[string]any{"accountId": fmt.Sprintf("acct-%02d", a), "currency": "EUR", "openingBalanceMinor": openingMinor}); code != http.StatusCreated {
			t.Fatalf("create account: %d", code)
		}
	}
	copiesMu.Lock()
	for p := range payouts {
		id := fmt.Sprintf("p-%03d", p)
		amounts[id] = 100 + rng.Int64N(50_000)
		body := map[string]any{"payoutId": id, "accountId": fmt.Sprintf("acct-%02d", rng.IntN(accounts)), "amountMinor": amounts[id], "currency": "EUR"}
		copiesMu.Unlock()
		if code := postJSON(t, payURL+api.PathPayouts, body); code != http.StatusCreated {
			t.Fatalf("create payout %s: %d", id, code)
		}
		copiesMu.Lock()
	}
	copiesMu.Unlock()

	// Wait until every payout is final, by paydb's own account.
	pool, err := pgxpool.New(ctx, st.paydb)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		var final int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM payout WHERE state IN ('posted','declined','ambiguous')`).Scan(&final); err != nil {
			t.Fatal(err)
		}
		if final == payouts {
			break
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("only %d of %d payouts final before the deadline", final, payouts)
		}
	}

	// INV-04: the rail received exactly one submission per payout.
	subs := stub.Submissions("")
	perPayout := map[string]int{}
	ackRefs := map[string]bool{}
	for _, s := range subs {
		perPayout[s.Request.PayoutID]++
		if s.Answer.Status == rail.StatusAck {
			ackRefs[s.Answer.RailRef] = true
		}
	}
	if len(subs) != payouts || len(perPayout) != payouts {
		t.Errorf("rail received %d submissions for %d payouts; want exactly one for each of %d", len(subs), len(perPayout), payouts)
	}
	for id, n := range perPayout {
		if n != 1 {
			t.Errorf("payout %s reached the rail %d times", id, n)
		}
	}
	// Every payout posted once, for its amount.
	rows, err := pool.Query(ctx, `SELECT payout_id, state, amount_minor FROM payout`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, state string
		var amount int64
		if err := rows.Scan(&id, &state, &amount); err != nil {
			t.Fatal(err)
		}
		if state != "posted" || amount != amounts[id] {
			t.Errorf("payout %s: state %s amount %d; want posted, %d", id, state, amount, amounts[id])
		}
	}
	rows.Close()
	// INV-04 and INV-05 across the rail's journal, raildb and paydb: the
	// ledger balances, and posted debits match acknowledged rail
	// submissions one for one.
	rep := st.audit(ctx, t, pool)
	if !rep.Balanced || rep.Debits != payouts || len(rep.Unreconciled) != 0 {
		t.Errorf("audit: balanced=%v debits=%d violations=%v unreconciled=%v; want balanced with %d debits", rep.Balanced, rep.Debits, rep.Violations, rep.Unreconciled, payouts)
	}
	refs, err := pool.Query(ctx, `SELECT rail_ref FROM ledger_txn WHERE kind = 'payout_debit'`)
	if err != nil {
		t.Fatal(err)
	}
	posted := 0
	for refs.Next() {
		var ref string
		if err := refs.Scan(&ref); err != nil {
			t.Fatal(err)
		}
		posted++
		if !ackRefs[ref] {
			t.Errorf("ledger debit for rail ref %s, which the rail never acknowledged", ref)
		}
	}
	refs.Close()
	if posted != len(ackRefs) {
		t.Errorf("%d posted debits for %d acknowledged rail submissions", posted, len(ackRefs))
	}
	// The deliveries really were duplicated.
	if n := int(rr.next.Load()); n < 2*payouts {
		t.Errorf("%d push requests for %d payouts; the bridge did not duplicate deliveries", n, payouts)
	}
	t.Logf("%d payouts, %d push requests, %d rail submissions, audit %+v", payouts, rr.next.Load(), len(subs), rep)
}
