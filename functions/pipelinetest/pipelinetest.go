// Package pipelinetest starts the payout pipeline inside one test process:
// payment-resource over its own paydb, rail-proxy over its own raildb, the
// rail-stub, and lock-server (one or two replicas, restartable with
// Pipeline.RestartLock) over a memstore whose clock the test moves. Every
// piece is the production code behind a loopback HTTP server, wrapped for
// tracing as the processes wrap theirs. It is for tests only and needs
// PostgreSQL: a test binary using it calls pgtest.Main from its TestMain.
package pipelinetest

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	payclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutaudit"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	railclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgpool"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// Options configure Start. The zero value has both fence points on.
type Options struct {
	// PaymentFencingOff and RailFencingOff turn the kill switches of
	// payment-resource and rail-proxy off.
	PaymentFencingOff, RailFencingOff bool
	// Log receives every service's log; nil discards it.
	Log *slog.Logger
	// RailHandler, when set, wraps the rail-stub: rail-proxy's calls to
	// the rail go through it (the explorer holds them there).
	RailHandler func(next http.Handler) http.Handler
	// ProxyHandler, when set, wraps rail-proxy's handler (the explorer
	// learns there when a submission whose caller gave up has ended).
	ProxyHandler func(next http.Handler) http.Handler
	// RailTimeout, when positive, is rail-proxy's RailTimeout (and
	// DBTimeout stays railproxy.MaxTimeout): a "hang" fault then ends the
	// forward as ambiguous after it. Zero keeps railproxy.MaxTimeout, so
	// that a held call is not a lost one.
	RailTimeout time.Duration
	// Publisher receives payment-resource's outbox messages (payout
	// events with their attributes); nil drops them. The outbox drains
	// when a payout is created.
	Publisher paymentresource.Publisher
	// TermsSigningKey, when set, is the key payment-resource signs payout
	// terms with; zero keeps fencingtest.TermsSigningKey(). RailTermsKeys,
	// when it holds a key, is rail-proxy's PAYMENT_TERMS_KEYS; empty keeps
	// fencingtest.TermsKeys(). Together they stage a key rotation done in the
	// wrong order (see Pipeline.ReplaceProxy).
	TermsSigningKey fenceproof.SigningKey
	RailTermsKeys   fenceproof.Keyring
	// LockReplicas is how many lock-servers run over the one lock store
	// (Pipeline.LockURLs): 1 when 0, 2 as lock-server's Deployment runs.
	LockReplicas int
}

// Clock is the lock store's clock: it stands still unless Advance moves it.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock d forward.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Pipeline is a started pipeline. Its servers and pools are closed when
// the test ends.
type Pipeline struct {
	// Locks is lock-server's store, on LockClock: the backend every
	// replica's store is opened on.
	Locks     *memstore.Store
	LockClock *Clock
	// LockURL, PayURL and ProxyURL are the base URLs of lock-server (its
	// first replica), payment-resource and rail-proxy.
	LockURL, PayURL, ProxyURL string
	// LockURLs are the base URLs of lock-server's replicas
	// (Options.LockReplicas); LockURLs[0] is LockURL.
	LockURLs []string
	// RailURL is the base URL of the rail (rail-stub, through
	// Options.RailHandler), as rail-proxy calls it.
	RailURL string
	// Pay is a typed client of payment-resource at PayURL.
	Pay *payclient.Client
	// Rail is a typed client of rail-proxy at ProxyURL.
	Rail *railclient.Client
	// Stub is the rail.
	Stub *railstub.Stub
	// PayDB and RailDB are pools on the two databases, for checks.
	PayDB, RailDB *pgxpool.Pool

	proxyCfg railproxy.Config
	proxyLog *slog.Logger
	proxy    atomic.Pointer[railproxy.Proxy]

	lockCfg  lockserver.ServerConfig
	lockLog  *slog.Logger
	replicas []*lockReplica
}

// lockReplica is one lock-server replica: the Server serving at its URL
// and the store it was opened with.
type lockReplica struct {
	mu     sync.Mutex // serializes restarts
	server atomic.Pointer[lockserver.Server]
	store  *replicaStore
}

// replicaStore is a replica's store over the shared memstore: the
// backend's state (leases, the token counter) is the memstore's, as
// lockdb's is PostgreSQL's, and a replica opens its own store on it. Once
// closed it refuses Ping. Everything else is the memstore's, including its
// batch and handoff capabilities, so that a replica's Server batches and
// hands off as a single lock-server's does.
type replicaStore struct {
	*memstore.Store
	closed atomic.Bool
}

func (s *replicaStore) Ping(ctx context.Context) error {
	if s.closed.Load() {
		return store.ErrUnavailable
	}
	return s.Store.Ping(ctx)
}

func (s *replicaStore) Close() error {
	s.closed.Store(true)
	return nil
}

// openLock starts a lock-server over a new store on Locks.
func (p *Pipeline) openLock() (*lockserver.Server, *replicaStore, error) {
	st := &replicaStore{Store: p.Locks}
	ls, err := lockserver.NewServer(st, p.lockCfg, p.lockLog)
	return ls, st, err
}

// RestartLock restarts lock-server replica i (0 is LockURL's): its Server
// is closed with its store, and a new Server over a newly opened store on
// the same backend serves at the same URL from now on. What the old one
// kept in memory (its token floor, its wait queues, its batches) is gone;
// what the backend holds is not. Call it while no request is in flight
// at that replica: a request that arrives later reaches the new Server.
func (p *Pipeline) RestartLock(i int) error {
	rp := p.replicas[i]
	rp.mu.Lock()
	defer rp.mu.Unlock()
	next, st, err := p.openLock()
	if err != nil {
		return err
	}
	old, oldStore := rp.server.Swap(next), rp.store
	rp.store = st
	err = old.Close()
	return errors.Join(err, oldStore.Close())
}

// ReplaceProxy starts a new rail-proxy on the same raildb and rail with
// its configuration changed by mod, serves it at ProxyURL from now on,
// and closes the old one (waiting for its requests in flight): a
// redeploy of rail-proxy, e.g. with a key added to its TermsKeys.
func (p *Pipeline) ReplaceProxy(t testing.TB, mod func(*railproxy.Config)) {
	t.Helper()
	cfg := p.proxyCfg
	mod(&cfg)
	next, err := railproxy.New(context.Background(), cfg, p.proxyLog)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = next.Close() })
	p.proxyCfg = cfg
	_ = p.proxy.Swap(next).Close()
}

type nopPublisher struct{}

func (nopPublisher) Publish(context.Context, string, []byte, map[string]string) error { return nil }

// Start starts a pipeline for t, with fresh databases.
func Start(t testing.TB, opts Options) *Pipeline {
	t.Helper()
	ctx := context.Background()
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	serve := func(service string, h http.Handler) string {
		s := httptest.NewServer(tracing.Handler(service, h))
		t.Cleanup(s.Close)
		return s.URL
	}
	open := func(dsn string) *pgxpool.Pool {
		p, err := pgxpool.New(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	p := &Pipeline{LockClock: &Clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}}
	p.Locks = memstore.New(p.LockClock)
	p.lockCfg = lockserver.DefaultServerConfig()
	p.lockCfg.ProofKey = fencingtest.LockSigningKey()
	p.lockLog = log.With("service", "lock-server")
	for range max(opts.LockReplicas, 1) {
		ls, st, err := p.openLock()
		if err != nil {
			t.Fatal(err)
		}
		rp := &lockReplica{store: st}
		rp.server.Store(ls)
		p.replicas = append(p.replicas, rp)
		p.LockURLs = append(p.LockURLs, serve("lock-server", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rp.server.Load().ServeHTTP(w, r)
		})))
	}
	p.LockURL = p.LockURLs[0]

	var err error
	p.Stub, err = railstub.New(railstub.DefaultConfig(), log.With("service", "rail-stub"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stub.Close() })
	var rail http.Handler = p.Stub
	if opts.RailHandler != nil {
		rail = opts.RailHandler(rail)
	}
	raildb := pgtest.NewDatabase(t)
	pcfg := railproxy.DefaultConfig()
	pcfg.DB = pgpool.Config{DSN: raildb}
	p.RailURL = serve("rail-stub", rail)
	pcfg.RailURL = p.RailURL
	pcfg.RailTimeout, pcfg.DBTimeout = railproxy.MaxTimeout, railproxy.MaxTimeout // a held call is not a lost one
	// Nor is a slow database a stalled one: on a loaded machine (CI, the
	// explorer beside other tests) a ping on a new connection can take
	// longer than the 1 s default, and a 503 there is a test failure
	// that says nothing about fencing. The stall tests have their own.
	pcfg.StallAfter = 0
	if opts.RailTimeout > 0 {
		pcfg.RailTimeout = opts.RailTimeout
	}
	pcfg.FencingDisabled = opts.RailFencingOff
	pcfg.ProofKeys, pcfg.ReceiptKey = fencingtest.ProofKeys(), fencingtest.ReceiptSigningKey()
	pcfg.TermsKeys = fencingtest.TermsKeys()
	if opts.RailTermsKeys.Len() > 0 {
		pcfg.TermsKeys = opts.RailTermsKeys
	}
	p.proxyCfg, p.proxyLog = pcfg, log.With("service", "rail-proxy")
	proxy, err := railproxy.New(ctx, pcfg, p.proxyLog)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	p.proxy.Store(proxy)
	var proxyHandler http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { p.proxy.Load().ServeHTTP(w, r) })
	if opts.ProxyHandler != nil {
		proxyHandler = opts.ProxyHandler(proxyHandler)
	}
	p.ProxyURL = serve("rail-proxy", proxyHandler)
	if p.Rail, err = railclient.New(p.ProxyURL); err != nil {
		t.Fatal(err)
	}
	p.RailDB = open(raildb)

	paydb := pgtest.NewDatabase(t)
	paycfg := paymentresource.DefaultConfig()
	paycfg.DatabaseURL, paycfg.OutboxPoll, paycfg.FencingDisabled = paydb, 10*time.Minute, opts.PaymentFencingOff
	paycfg.ProofKeys, paycfg.ReceiptKeys = fencingtest.ProofKeys(), fencingtest.ReceiptKeys()
	paycfg.TermsKey = fencingtest.TermsSigningKey()
	if !opts.TermsSigningKey.IsZero() {
		paycfg.TermsKey = opts.TermsSigningKey
	}
	paycfg.StallAfter = 0 // as rail-proxy's above
	var pub paymentresource.Publisher = nopPublisher{}
	if opts.Publisher != nil {
		pub = opts.Publisher
	}
	svc, err := paymentresource.New(ctx, paycfg, pub, log.With("service", "payment-resource"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	p.PayURL = serve("payment-resource", svc.Handler())
	if p.Pay, err = payclient.New(p.PayURL); err != nil {
		t.Fatal(err)
	}
	p.PayDB = open(paydb)
	return p
}

// CreatePayout creates e's account (with a large opening balance) and the
// payout e describes, through payment-resource's API; both already
// existing alike is no error.
func (p *Pipeline) CreatePayout(ctx context.Context, e payoutevent.Event) error {
	opening := int64(1_000_000_000)
	if _, err := p.Pay.CreateAccount(ctx, api.AccountRequest{AccountID: e.AccountID, Currency: e.Currency, OpeningBalanceMinor: &opening}); err != nil {
		return err
	}
	_, err := p.Pay.CreatePayout(ctx, api.PayoutRequest{PayoutID: e.PayoutID, AccountID: e.AccountID, AmountMinor: e.AmountMinor, Currency: e.Currency})
	return err
}

// Audit runs payoutaudit.Run over the pipeline's records: for the payouts
// named, or for every payout (with the ledger audit) when none is.
func (p *Pipeline) Audit(ctx context.Context, payoutIDs ...string) (payoutaudit.Report, error) {
	var rail []rail.Submission
	if len(payoutIDs) == 0 {
		rail = p.Stub.Submissions("")
		payoutIDs = nil
	} else {
		for _, id := range payoutIDs {
			rail = append(rail, p.Stub.Submissions(id)...)
		}
	}
	return payoutaudit.Run(ctx, p.PayDB, p.RailDB, rail, payoutIDs)
}
