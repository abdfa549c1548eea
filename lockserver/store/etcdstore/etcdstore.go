// Package etcdstore is the etcd implementation of store.LockStore,
// over go.etcd.io/etcd/client/v3.
//
// Open a Store with Open (cfg from DefaultConfig with Endpoints set) or
// wrap an existing client with New, and Close it when done. A lock key k
// is the etcd key Prefix+k, present exactly while the lock is held, on an
// etcd lease that carries that one grant in its whole life. The fencing
// token is the granting transaction's revision plus a token offset kept
// near lock-server's clock; etcd's leader decides expiry. An unreachable
// cluster or a timeout wraps store.ErrUnavailable: the operation may
// or may not have taken effect. The design: docs/lock-service.md.
package etcdstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// Defaults of Config, as DefaultConfig returns them.
const (
	// DefaultPrefix is the etcd key prefix of every lock key.
	DefaultPrefix = "/dlock/locks/"
	// DefaultDialTimeout bounds the client's setup calls (see Config).
	DefaultDialTimeout = 5 * time.Second
	// DefaultRequestTimeout bounds one store method, all its etcd calls
	// included. It is longer than an etcd leader election (1 s with etcd's
	// defaults) so a method survives one, and shorter than lock-server's
	// HTTP timeouts so the server answers 503 rather than the client timing
	// out.
	DefaultRequestTimeout = 5 * time.Second
	// DefaultReconnectMaxDelay caps the gRPC reconnect backoff. gRPC's own
	// cap is 120 s, longer than any lease; a lock service must come back
	// within a TTL of etcd coming back.
	DefaultReconnectMaxDelay = 2 * time.Second
	// DefaultIdleLeases is how many idle etcd leases, granted ahead of
	// time and never used, a Store keeps for its next acquires: enough for
	// the grants one lock-server makes in a burst; each is a few hundred
	// bytes in etcd's lessor.
	DefaultIdleLeases = 64
)

// keepAliveTime and keepAliveTimeout make the client ping a member whose
// connection has been silent for keepAliveTime and drop the connection when
// no answer comes within keepAliveTimeout. A member behind a network
// partition sends no reset: without the ping its connection stays up for
// TCP's retransmission timeout (about 15 minutes), and the client keeps
// sending it a share of the requests, which time out. etcd refuses pings
// more often than every 5 s (--grpc-keepalive-min-time).
const (
	keepAliveTime    = 5 * time.Second
	keepAliveTimeout = 2 * time.Second
)

// aheadQueue bounds the acquires' requests waiting for the granter; past
// it a request is dropped, since the granter tops the pool up for the
// requests it does read.
const aheadQueue = 16

// ErrInvalidConfig is returned, wrapped, by Config.Validate, Open and New.
var ErrInvalidConfig = errors.New("etcdstore: invalid config")

// Clock is lock-server's time source, read to compute Lease.ExpiresAt.
type Clock interface {
	Now() time.Time
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// Config configures a Store. Start from DefaultConfig: the zero value is
// not the defaults (and is not valid). Open and New do not modify it.
type Config struct {
	// Endpoints are the etcd client URLs ("http://127.0.0.1:2379"). Required
	// by Open; ignored by New.
	Endpoints []string

	// Prefix is prepended to every lock key. It must start and end with
	// "/" so that no prefix is a prefix of another's keys. Default
	// DefaultPrefix. Two
	// lock-servers share locks exactly when they share endpoints and Prefix.
	Prefix string

	// DialTimeout bounds the client's setup calls and derives its first
	// keep-alive timeout (clientv3.Config.DialTimeout); creating the client
	// does not block on it. Default DefaultDialTimeout; must be positive.
	DialTimeout time.Duration

	// RequestTimeout bounds each store method, all its etcd calls included,
	// on top of the caller's context. Default DefaultRequestTimeout; must
	// be positive.
	RequestTimeout time.Duration

	// ReconnectMaxDelay caps the gRPC reconnect backoff of a client made by
	// Open. Default DefaultReconnectMaxDelay; must be positive.
	ReconnectMaxDelay time.Duration

	// IdleLeases caps the idle etcd leases, granted ahead of time and
	// never used, that the Store keeps so that an acquire need not wait for
	// a lease grant (a raft write). Each lease carries at
	// most one grant whatever this is. Default DefaultIdleLeases; 0 turns
	// the pool off (the same meaning as lock-server's ETCD_IDLE_LEASES=0):
	// every acquire waits for a lease grant, and the Store starts no
	// goroutine. Must not be negative.
	IdleLeases int

	// Clock is read for ExpiresAt. Nil (DefaultConfig's): the wall clock.
	Clock Clock

	// EtcdLogger receives the etcd client's own logs. Nil: discarded (the
	// store reports every failure in its returned errors).
	EtcdLogger *zap.Logger
}

// DefaultConfig returns the defaults documented on Config; Endpoints is
// left empty (Open requires it).
func DefaultConfig() Config {
	return Config{
		Prefix:            DefaultPrefix,
		DialTimeout:       DefaultDialTimeout,
		RequestTimeout:    DefaultRequestTimeout,
		ReconnectMaxDelay: DefaultReconnectMaxDelay,
		IdleLeases:        DefaultIdleLeases,
	}
}

// Validate returns nil or one error per invalid field, Endpoints included
// (as Open needs them), joined (errors.Join), each wrapping
// ErrInvalidConfig.
func (c Config) Validate() error {
	errs := []error{c.validate()}
	if len(c.Endpoints) == 0 {
		errs = append(errs, fmt.Errorf("%w: no endpoints", ErrInvalidConfig))
	}
	for _, ep := range c.Endpoints {
		if ep == "" {
			errs = append(errs, fmt.Errorf("%w: empty endpoint", ErrInvalidConfig))
			break
		}
	}
	return errors.Join(errs...)
}

// validate checks everything but Endpoints (New takes a client instead).
func (c Config) validate() error {
	var errs []error
	if !strings.HasPrefix(c.Prefix, "/") || !strings.HasSuffix(c.Prefix, "/") {
		errs = append(errs, fmt.Errorf("%w: prefix %q does not start and end with /", ErrInvalidConfig, c.Prefix))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"dial timeout", c.DialTimeout}, {"request timeout", c.RequestTimeout}, {"reconnect max delay", c.ReconnectMaxDelay}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%w: %s %v is not positive", ErrInvalidConfig, d.name, d.v))
		}
	}
	if c.IdleLeases < 0 {
		errs = append(errs, fmt.Errorf("%w: idle leases %d: want 0 (no pool) or a positive cap", ErrInvalidConfig, c.IdleLeases))
	}
	return errors.Join(errs...)
}

// Store is the etcd LockStore. It is safe for concurrent use and keeps no
// lock state of its own (only idle leases). With the
// pool on it runs one goroutine, the granter, which grants batches of idle
// leases as acquires need them, sending a batch's grants from goroutines of
// its own and waiting for them; it exits when Close cancels the Store's
// lifetime context, and Close waits for it. An acquire on an
// idle lease sends its keep-alive from a goroutine of its own and waits for
// it; the etcd client a Store owns has its own goroutines, ended by Close.
// A Handoff revokes the lease it emptied from a goroutine of its own,
// which Close waits for.
type Store struct {
	cli        *clientv3.Client
	ownsClient bool
	prefix     string
	reqTimeout time.Duration
	clock      Clock
	log        *slog.Logger
	pool       *leasePool
	guard      guard         // the restore guard's stamp: guard.go
	off        offsets       // the token offset: offset.go
	fromPool   atomic.Uint64 // grants made on an idle lease
	// maxTxnMembers caps the members of one group-grant transaction
	// (batch.go); tests raise it past etcd's limit.
	maxTxnMembers int
	granted       atomic.Uint64 // etcd leases granted

	// With the pool on: the TTLs (in whole seconds) acquires asked the
	// granter to top up; nil with the pool off.
	ahead   chan int64
	stop    context.CancelFunc // ends the granter's lifetime context
	workers sync.WaitGroup

	// The background revocations of the leases of ended grants
	// (revokeLater); Close waits for them, and none starts once closing.
	bgMu    sync.Mutex
	closing bool
	bg      sync.WaitGroup
	revoked atomic.Uint64 // leases of ended grants revoked

	closeOnce sync.Once
	closeErr  error
}

var _ store.LockStore = (*Store)(nil)

// Open connects to the cluster at cfg.Endpoints and returns a Store that
// owns the client (Close closes it). It returns once the cluster answered a
// linearizable read, bounded by ctx (ErrUnavailable otherwise), so a wrong
// endpoint fails here rather than at the first lock request. logger may be
// nil (discard).
func Open(ctx context.Context, cfg Config, logger *slog.Logger) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	etcdLog := cfg.EtcdLogger
	if etcdLog == nil {
		etcdLog = zap.NewNop()
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            append([]string(nil), cfg.Endpoints...),
		DialTimeout:          cfg.DialTimeout,
		DialKeepAliveTime:    keepAliveTime,
		DialKeepAliveTimeout: keepAliveTimeout,
		Logger:               etcdLog,
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: cfg.ReconnectMaxDelay},
			MinConnectTimeout: cfg.DialTimeout,
		})},
	})
	if err != nil {
		return nil, fmt.Errorf("etcdstore: client for %v: %w", cfg.Endpoints, err)
	}
	s := newStore(cli, true, cfg, logger)
	if err := s.Ping(ctx); err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("etcdstore: etcd at %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}
	return s, nil
}

// New returns a Store over an existing client, which it does not own:
// Close leaves cli open. cfg.Endpoints is ignored. New makes no request.
func New(cli *clientv3.Client, cfg Config, logger *slog.Logger) (*Store, error) {
	if cli == nil {
		return nil, fmt.Errorf("%w: nil client", ErrInvalidConfig)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return newStore(cli, false, cfg, logger), nil
}

func newStore(cli *clientv3.Client, owns bool, cfg Config, logger *slog.Logger) *Store {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = wallClock{}
	}
	s := &Store{
		cli: cli, ownsClient: owns, prefix: cfg.Prefix,
		reqTimeout: cfg.RequestTimeout, clock: cfg.Clock, maxTxnMembers: defaultMaxTxnMembers,
		log:  logger.With("store", "etcd", "prefix", cfg.Prefix),
		pool: newLeasePool(cfg.IdleLeases),
		stop: func() {},
	}
	if s.pool.off() {
		return s
	}
	// The lifetime context of the goroutines below; Close cancels it.
	ctx, stop := context.WithCancel(context.Background())
	s.stop = stop
	// Requests to top up coalesce in pool.topUp: a few waiting are enough.
	s.ahead = make(chan int64, aheadQueue)
	s.workers.Add(1)
	go s.grantAhead(ctx)
	return s
}

// grantAhead is the granter: for each TTL an acquire asked for, it grants
// the batch the pool wants (pool.topUp), all at once, and waits for the
// batch before it reads the next request. It returns when ctx ends.
func (s *Store) grantAhead(ctx context.Context) {
	defer s.workers.Done()
	var batch sync.WaitGroup
	for {
		select {
		case <-ctx.Done():
			return
		case secs := <-s.ahead:
			for range s.pool.topUp(secs) {
				batch.Go(func() { s.grantIdle(ctx, secs) })
			}
			batch.Wait()
		}
	}
}

// grantIdle grants one lease of secs seconds for the pool, which has
// reserved room for it. A grant that fails is not retried: the next
// acquire asks again, and grants inline if the pool is empty.
func (s *Store) grantIdle(ctx context.Context, secs int64) {
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	sentAt := s.clock.Now() // monotonic, for the pool
	g, err := s.cli.Grant(ctx, secs)
	if err != nil {
		s.pool.ungranted(secs)
		s.log.Debug("idle lease grant failed", "err", err)
		return
	}
	s.granted.Add(1)
	s.pool.learnFloor(secs, g.TTL)
	if !s.pool.granted(secs, g.ID, time.Duration(g.TTL)*time.Second, sentAt, s.clock.Now()) {
		// Too late to be handed out (a slow grant), or the pool filled
		// with younger leases: it carries nothing and expires on its own.
		s.log.Debug("idle lease not pooled", "leaseId", leaseID(int64(g.ID)))
	}
}

// askAhead asks the granter to top up the idle leases of secs seconds,
// unless the pool is off or enough requests are waiting already.
func (s *Store) askAhead(secs int64) {
	if s.ahead == nil {
		return
	}
	select {
	case s.ahead <- secs:
	default:
	}
}

// Acquire implements store.LockStore. It attaches the key, if absent,
// to a lease of ceil(ttl) seconds that has never carried a key (an idle one
// from the pool, reset by a keep-alive sent with the transaction, or one
// granted inline), in one transaction; the token is that transaction's
// revision plus the token offset. etcd may raise the TTL to its floor:
// Lease.TTL is the TTL granted. A grant is reported only when the lease was
// alive and reset to its full TTL. If the key is held, the unused lease goes
// back to the pool and ErrLockHeld is returned.
func (s *Store) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (store.Lease, error) {
	if err := store.ValidateAcquire(key, owner, ttl); err != nil {
		return store.Lease{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()

	if err := ctx.Err(); err != nil {
		// Before anything is sent, so that no idle lease is spent on it.
		return store.Lease{}, s.fail("acquire", key, "start", err)
	}
	if err := s.guardBefore(ctx); err != nil { // the restore guard: guard.go
		return store.Lease{}, err
	}
	secs := int64((ttl + time.Second - 1) / time.Second)
	idle, ok := s.pool.take(secs, s.clock.Now())
	s.askAhead(secs)
	if ok {
		if l, done, err := s.acquireOnIdle(ctx, key, owner, idle); done {
			return l, err
		}
	}
	sentAt := s.clock.Now() // monotonic, for the pool
	g, err := s.cli.Grant(ctx, secs)
	if err != nil {
		return store.Lease{}, s.fail("acquire", key, "grant lease", err)
	}
	s.granted.Add(1)
	granted := time.Duration(g.TTL) * time.Second
	s.pool.learnFloor(secs, g.TTL)
	resp, token, err := s.create(ctx, key, owner, g.ID, granted)
	if err != nil {
		// The transaction may have applied. Revoking its lease ends the
		// grant either way, so the caller's "unknown" is at worst a grant
		// that nobody holds for less than a TTL.
		s.revokeBestEffort(ctx, key, g.ID)
		return store.Lease{}, s.fail("acquire", key, "create key", err)
	}
	if !resp.Succeeded {
		if !s.pool.putUnused(g.ID, granted, sentAt, s.clock.Now()) {
			s.revokeBestEffort(ctx, key, g.ID)
		}
		return store.Lease{}, heldBy(key, resp)
	}
	return store.Lease{
		Key: key, Owner: owner, Token: token,
		LeaseID: leaseID(int64(g.ID)), TTL: granted, ExpiresAt: sentAt.Round(0).Add(granted),
	}, nil
}

// acquireOnIdle is Acquire on an idle lease: the keep-alive that resets it
// and the creating transaction are sent at once. done is false when the
// lease had ended, and nothing was granted: Acquire goes on with a new
// lease.
func (s *Store) acquireOnIdle(ctx context.Context, key, owner string, idle pooledLease) (l store.Lease, done bool, err error) {
	sentAt := s.clock.Now()
	kac := s.keepAliveBeside(ctx, idle.id)
	resp, token, err := s.create(ctx, key, owner, idle.id, idle.ttl)
	ka := <-kac
	switch {
	case err == nil && !resp.Succeeded:
		if ka.err == nil {
			s.pool.putUnused(idle.id, idle.ttl, sentAt, s.clock.Now())
		}
		return store.Lease{}, true, heldBy(key, resp)
	case errors.Is(ka.err, rpctypes.ErrLeaseNotFound), errors.Is(err, rpctypes.ErrLeaseNotFound):
		// The lease had ended (revoked by someone else, or expired because
		// the keep-alive came more than the pool's margin late): etcd
		// refused the transaction, or deleted the key with the lease. No
		// grant exists.
		return store.Lease{}, false, nil
	case ka.err != nil || err != nil:
		// Either outcome is unknown; revoking the lease ends any grant.
		s.revokeBestEffort(ctx, key, idle.id)
		if err != nil {
			return store.Lease{}, true, s.fail("acquire", key, "create key", err)
		}
		return store.Lease{}, true, s.fail("acquire", key, "reset an idle lease", ka.err)
	}
	ttl := time.Duration(ka.resp.TTL) * time.Second
	s.fromPool.Add(1)
	return store.Lease{
		Key: key, Owner: owner, Token: token,
		LeaseID: leaseID(int64(idle.id)), TTL: ttl, ExpiresAt: sentAt.Round(0).Add(ttl),
	}, true, nil
}

// keepAliveBeside sends one keep-alive for lease id from a goroutine of
// its own and returns where its outcome will come (once): a grant on an
// idle lease (acquireOnIdle, handoffOnIdle) sends it beside its
// transaction, so that taking the lease costs no round trip of its own.
func (s *Store) keepAliveBeside(ctx context.Context, id clientv3.LeaseID) <-chan keptAlive {
	kac := make(chan keptAlive, 1)
	go func() {
		resp, err := s.cli.KeepAliveOnce(ctx, id)
		kac <- keptAlive{resp, err}
	}()
	return kac
}

// create runs Acquire's transaction: create the key with lease id and a
// record of owner, ttl and the token offset if it does not exist and the
// offset is still the version the store compares with (offset.go), else
// read both; a changed offset is read and the transaction sent again. It
// returns the grant's token when resp.Succeeded. A grant made where the
// restore guard does not allow it is an error wrapping
// store.ErrBackendRestored.
func (s *Store) create(ctx context.Context, key, owner string, id clientv3.LeaseID, ttl time.Duration) (resp *clientv3.TxnResponse, token int64, err error) {
	k, ok := s.prefix+key, s.offsetKey()
	for range offsetTries {
		off, err := s.tokenOffset(ctx, "acquire")
		if err != nil {
			return nil, 0, err
		}
		resp, err = s.cli.Txn(ctx).
			If(append([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(k), "=", 0)}, off.compares(ok)...)...).
			Then(clientv3.OpPut(k, encodeRecord(owner, ttl, off.x), clientv3.WithLease(id))).
			Else(clientv3.OpGet(k), clientv3.OpGet(ok)).
			Commit()
		if err != nil {
			return resp, 0, err
		}
		if resp.Succeeded {
			return resp, resp.Header.Revision + off.x, s.guardAfter(ctx, resp)
		}
		if err := s.learnOffset(resp.Responses[1]); err != nil {
			return nil, 0, err
		}
		if len(resp.Responses[0].GetResponseRange().GetKvs()) > 0 {
			return resp, 0, nil // held
		}
	}
	return nil, 0, fmt.Errorf("%w: etcdstore: acquire %q: the token offset changed under %d attempts in a row", store.ErrUnavailable, key, offsetTries)
}

// heldBy is ErrLockHeld for a create transaction that found the key.
func heldBy(key string, resp *clientv3.TxnResponse) error {
	if rr := resp.Responses[0].GetResponseRange(); rr != nil && len(rr.Kvs) > 0 {
		return fmt.Errorf("%w: key %q is held with token %d", store.ErrLockHeld, key, tokenOf(rr.Kvs[0]))
	}
	return fmt.Errorf("%w: key %q", store.ErrLockHeld, key)
}

// Renew implements store.LockStore: it reads the key, checks the
// grant's token and owner, and sends one keep-alive for the grant's lease.
// etcd refuses a keep-alive for a lease that has ended, so a renewal never
// brings a grant back, and the lease carries no other grant, so it never
// extends one. A refused keep-alive is answered ErrStaleToken if a newer
// grant holds the key, else ErrNotHeld. ExpiresAt is lock-server's clock
// just before the keep-alive plus the TTL etcd reports.
func (s *Store) Renew(ctx context.Context, key, owner string, token int64) (store.Lease, error) {
	if err := store.ValidateLease(key, owner, token); err != nil {
		return store.Lease{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()

	kv, rec, err := s.get(ctx, "renew", key)
	if err != nil {
		return store.Lease{}, err
	}
	if err := refusal(key, kv, rec, owner, token); err != nil {
		return store.Lease{}, err
	}
	return s.keepAlive(ctx, store.LeaseRef{Key: key, Owner: owner, Token: token}, kv)
}

// keepAlive is Renew's second step: one keep-alive for the lease of grant
// kv, which was read and checked to be the live grant ref.
func (s *Store) keepAlive(ctx context.Context, ref store.LeaseRef, kv *mvccpb.KeyValue) (store.Lease, error) {
	sentAt := s.clock.Now()
	ka, err := s.cli.KeepAliveOnce(ctx, clientv3.LeaseID(kv.Lease))
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// The grant ended after it was read. A Handoff may have ended it
		// (the key moved to a newer grant's lease, the old lease revoked
		// in the background) without the key being free at any moment:
		// then only ErrStaleToken is true. Read the key again to tell.
		now, rec, rerr := s.get(ctx, "renew", ref.Key)
		if rerr != nil {
			return store.Lease{}, rerr
		}
		if rerr := refusal(ref.Key, now, rec, ref.Owner, ref.Token); errors.Is(rerr, store.ErrStaleToken) {
			return store.Lease{}, rerr
		}
		return store.Lease{}, fmt.Errorf("%w: lease of key %q with token %d has ended", store.ErrNotHeld, ref.Key, ref.Token)
	}
	if err != nil {
		return store.Lease{}, s.fail("renew", ref.Key, "keep-alive", err)
	}
	ttl := time.Duration(ka.TTL) * time.Second
	return store.Lease{
		Key: ref.Key, Owner: ref.Owner, Token: ref.Token,
		LeaseID: leaseID(kv.Lease), TTL: ttl, ExpiresAt: sentAt.Round(0).Add(ttl),
	}, nil
}

// Release implements store.LockStore in one transaction (endGrants):
// the key is deleted if its grant's token (ModRevision plus the record's
// offset) is token and its owner is owner, else read to say why not; the
// emptied lease is revoked in the background. Of a release, a
// force-revoke, a handoff and an expiry racing for one grant exactly one
// ends it. ErrStaleToken when a newer grant is live, ErrNotHeld when no
// grant or another owner's is, ErrInvalidArgument, ErrUnavailable.
func (s *Store) Release(ctx context.Context, key, owner string, token int64) error {
	if err := store.ValidateLease(key, owner, token); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	return s.endGrants(ctx, "release", []store.LeaseRef{{Key: key, Owner: owner, Token: token}})[0].err
}

// Revoke implements store.LockStore. With token > 0 it is Release's
// transaction checking the token alone, whoever the owner (ErrStaleToken
// if a newer grant is live, ErrNotHeld if an older one is). With no token
// it reads the live grant and ends it so; a grant replaced between the
// read and the end is read again, up to inspectTries times. The returned
// lease is the revoked grant, with ExpiresAt set to lock-server's clock
// just before the transaction that deleted it was sent.
func (s *Store) Revoke(ctx context.Context, key string, token int64) (store.Lease, error) {
	if err := store.ValidateKey(key); err != nil {
		return store.Lease{}, err
	}
	if err := store.ValidateRevokeToken(token); err != nil {
		return store.Lease{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()

	ref := store.LeaseRef{Key: key, Token: token} // no owner: anyone's
	for range inspectTries {
		if token == 0 {
			kv, rec, err := s.get(ctx, "revoke", key)
			if err != nil {
				return store.Lease{}, err
			}
			if kv == nil {
				return store.Lease{}, fmt.Errorf("%w: no live lease on key %q", store.ErrNotHeld, key)
			}
			ref = store.LeaseRef{Key: key, Owner: rec.Owner, Token: kv.ModRevision + rec.Offset}
		}
		e := s.endGrants(ctx, "revoke", []store.LeaseRef{ref})[0]
		if token == 0 && errors.Is(e.err, store.ErrStaleToken) {
			// A newer grant replaced the one read (a handoff, or a
			// release and an acquire) without the key being free between
			// the read and the delete, or with it free only briefly:
			// revoke whatever is live now.
			continue
		}
		if e.err != nil {
			return store.Lease{}, e.err
		}
		return store.Lease{
			Key: key, Owner: e.rec.Owner, Token: ref.Token,
			LeaseID: leaseID(e.kv.Lease), TTL: time.Duration(e.rec.TTLMs) * time.Millisecond, ExpiresAt: e.sent,
		}, nil
	}
	return store.Lease{}, fmt.Errorf("%w: etcdstore: revoke %q: the key changed grants under %d attempts in a row", store.ErrUnavailable, key, inspectTries)
}

// ended is the outcome of ending one grant (endGrants): the deleted key,
// its record and lock-server's clock just before the transaction that
// deleted it was sent, or why it was not deleted.
type ended struct {
	kv   *mvccpb.KeyValue
	rec  record
	sent time.Time
	err  error
}

// endGrants ends each of refs that is its key's live grant (grantIs:
// token and owner, or the token alone for a ref with no owner), at most
// maxTxnMembers of them in one transaction, with G a guess of the offset
// each was granted with:
//
//	Then(for each ref: Txn(If(grantIs(ref, G))
//	                       Then(Delete(Prefix+k, WithPrevKV()))
//	                       Else(Get(Prefix+k))),
//	     Get(offset key))
//
// G is first the offset version the store guesses (grantedWith); a ref
// that is its key's live grant with another offset (read in its Else
// branch) is sent again with that offset and the owner read. The others
// are answered from the key as read (refusal). A deletion ends the grant:
// a Handoff moves the key off the old lease without revoking it, so the
// emptied lease is revoked in the background (revokeLater).
func (s *Store) endGrants(ctx context.Context, op string, refs []store.LeaseRef) []ended {
	out := make([]ended, len(refs))
	type member struct {
		i     int
		ref   store.LeaseRef
		guess offsetVersion
	}
	ms := make([]member, len(refs))
	for i, r := range refs {
		ms[i] = member{i, r, s.off.grantedWith(r.Token)}
	}
	ok := s.offsetKey()
	for len(ms) > 0 {
		part := ms[:min(len(ms), s.maxTxnMembers)]
		for range offsetTries {
			ops := make([]clientv3.Op, 0, len(part)+1)
			for _, m := range part {
				k := s.prefix + m.ref.Key
				ops = append(ops, clientv3.OpTxn(s.grantIs(m.ref, m.guess),
					[]clientv3.Op{clientv3.OpDelete(k, clientv3.WithPrevKV())}, []clientv3.Op{clientv3.OpGet(k)}))
			}
			sent := s.now()
			resp, err := s.cli.Txn(ctx).Then(append(ops, clientv3.OpGet(ok))...).Commit()
			var again []member
			for j, m := range part {
				key := m.ref.Key
				if err != nil {
					out[m.i].err = s.fail(op, key, "delete key", err)
					continue
				}
				nested := resp.Responses[j].GetResponseTxn()
				if nested == nil {
					out[m.i].err = fmt.Errorf("etcdstore: %s %q: the transaction's answer has no member %d", op, key, j)
					continue
				}
				if !nested.Succeeded {
					ref, guess, err := s.judge(op, m.ref, (*clientv3.TxnResponse)(nested))
					if out[m.i].err = err; err == nil {
						again = append(again, member{m.i, ref, offsetVersion{x: guess}})
					}
					continue
				}
				kv, rec, err := s.lockKV(op, key, nested.Responses[0].GetResponseDeleteRange().GetPrevKvs())
				if err == nil && kv == nil {
					err = fmt.Errorf("etcdstore: %s %q: the transaction deleted no key", op, key)
				}
				out[m.i] = ended{kv: kv, rec: rec, sent: sent, err: err}
				if kv != nil {
					s.revokeLater(key, clientv3.LeaseID(kv.Lease))
				}
			}
			if len(again) > 0 {
				if err := s.learnOffset(resp.Responses[len(part)]); err != nil {
					for _, m := range again {
						out[m.i].err = err
					}
					again = nil
				}
			}
			if part = again; len(part) == 0 {
				break
			}
		}
		for _, m := range part {
			out[m.i].err = fmt.Errorf("%w: etcdstore: %s %q: the key changed grants under %d attempts in a row", store.ErrUnavailable, op, m.ref.Key, offsetTries)
		}
		ms = ms[min(len(ms), s.maxTxnMembers):]
	}
	return out
}

// Inspect implements store.LockStore: it reads the key and, if
// present, asks the leader for its lease's remaining TTL. The lease is
// reported live while the key exists, as Acquire still refuses it between
// the TTL running out and the leader's revocation; ExpiresAt is
// lock-server's clock before the TTL query plus the remaining TTL, which
// etcd truncates to whole seconds, so it is a lower bound that moves
// between calls. LastToken is the token of the key's grant (its
// ModRevision plus its record's offset) while it exists, and 0 once etcd
// has deleted it.
func (s *Store) Inspect(ctx context.Context, key string) (store.State, error) {
	if err := store.ValidateKey(key); err != nil {
		return store.State{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()

	for range inspectTries {
		st := store.State{Key: key}
		kv, rec, err := s.get(ctx, "inspect", key)
		if err != nil || kv == nil {
			return st, err
		}
		st.LastToken = kv.ModRevision + rec.Offset
		sent := s.now()
		ttl, err := s.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease), clientv3.WithAttachedKeys())
		if err != nil {
			return store.State{}, s.fail("inspect", key, "lease time to live", err)
		}
		if ttl.TTL < 0 || !slices.ContainsFunc(ttl.Keys, func(k []byte) bool { return string(k) == s.prefix+key }) {
			// The grant ended between the two reads (the leader answers
			// TimeToLive only after applying everything it has
			// committed): released, revoked or expired, or handed off to
			// a new lease without the key ever being free. Read again.
			continue
		}
		st.Lease = &store.Lease{
			Key: key, Owner: rec.Owner, Token: st.LastToken, LeaseID: leaseID(kv.Lease),
			TTL: time.Duration(rec.TTLMs) * time.Millisecond, ExpiresAt: sent.Add(time.Duration(ttl.TTL) * time.Second),
		}
		return st, nil
	}
	return store.State{}, fmt.Errorf("%w: etcdstore: inspect %q: the key changed grants under %d reads in a row", store.ErrUnavailable, key, inspectTries)
}

// inspectTries bounds Inspect's reads of a key whose grant keeps ending
// between the read of the key and the read of its lease, and Revoke's
// attempts (with no token) on a key whose grant keeps being replaced
// between the read and the delete.
const inspectTries = 8

// LeaseStats counts this Store's etcd leases since Open, for metrics.
type LeaseStats struct {
	// Idle is the number of idle leases (granted ahead, never used) in
	// the pool now.
	Idle int
	// Granted counts the etcd leases granted (a raft write each), ahead
	// of time or by an acquire that found the pool empty.
	Granted uint64
	// FromPool counts the grants made on an idle lease from the pool,
	// for which the acquire did not wait for a lease grant.
	FromPool uint64
	// Revoked counts the leases revoked after their grant ended (a raft
	// write and a backend commit each, off the request's path: see
	// revokeLater).
	Revoked uint64
}

// LeaseStats returns the Store's lease counts.
func (s *Store) LeaseStats() LeaseStats {
	return LeaseStats{
		Idle: s.pool.len(), Granted: s.granted.Load(), FromPool: s.fromPool.Load(),
		Revoked: s.revoked.Load(),
	}
}

// Ping implements store.LockStore with a linearizable read of one key,
// which needs a leader and a quorum, bounded by RequestTimeout.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	if _, err := s.cli.Get(ctx, s.prefix, clientv3.WithCountOnly()); err != nil {
		return s.fail("ping", "", "read", err)
	}
	return nil
}

// Close implements store.LockStore: it stops the granter and waits
// for it, then closes the client if Open created it. Grants are not
// touched; idle leases carry no key and are left to expire. Calling it
// again returns the first result.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.bgMu.Lock()
		s.closing = true
		s.bgMu.Unlock()
		s.bg.Wait()
		s.stop()
		s.workers.Wait()
		if s.ownsClient {
			if err := s.cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
				s.closeErr = fmt.Errorf("etcdstore: close client: %w", err)
			}
		}
	})
	return s.closeErr
}

// record is the value of a lock key. Offset is the token offset the grant
// was made with (offset.go): its token is the key's ModRevision plus
// Offset. Records written before the offset existed have none: offset 0.
// The field order is part of Handoff's owner check (handoff.go).
type record struct {
	Owner  string `json:"owner"`
	Offset int64  `json:"offset,omitempty"`
	TTLMs  int64  `json:"ttlMs"`
}

// Every record's value starts with recordStart, and sorts between it and
// recordEnd.
const (
	recordStart = `{"owner":"`
	recordEnd   = `{"owner":#` // '#' follows '"'
)

// encodeRecord is the value of a lock key held by owner with a granted TTL
// of ttl, granted with token offset offset.
func encodeRecord(owner string, ttl time.Duration, offset int64) string {
	b, _ := json.Marshal(record{Owner: owner, Offset: offset, TTLMs: ttl.Milliseconds()}) // always encodes
	return string(b)
}

// tokenOf is the token of the grant a lock key carries, for messages: its
// ModRevision plus its record's offset (0 if the record does not parse).
func tokenOf(kv *mvccpb.KeyValue) int64 {
	var rec record
	_ = json.Unmarshal(kv.Value, &rec) // a foreign value is reported by lockKV
	return kv.ModRevision + rec.Offset
}

// get reads the key linearizably; kv is nil when it does not exist.
func (s *Store) get(ctx context.Context, op, key string) (*mvccpb.KeyValue, record, error) {
	resp, err := s.cli.Get(ctx, s.prefix+key)
	if err != nil {
		return nil, record{}, s.fail(op, key, "read key", err)
	}
	return s.lockKV(op, key, resp.Kvs)
}

// lockKV returns the lock key among kvs (nil if none) and its record,
// after checking it was written by this store.
func (s *Store) lockKV(op, key string, kvs []*mvccpb.KeyValue) (*mvccpb.KeyValue, record, error) {
	if len(kvs) == 0 {
		return nil, record{}, nil
	}
	kv := kvs[0]
	var rec record
	if err := json.Unmarshal(kv.Value, &rec); err != nil {
		return nil, record{}, fmt.Errorf("etcdstore: %s %q: etcd key %q is not a lock record: %w", op, key, kv.Key, err)
	}
	if kv.Lease == 0 {
		return nil, record{}, fmt.Errorf("etcdstore: %s %q: etcd key %q has no lease; it was not written by this store", op, key, kv.Key)
	}
	return kv, rec, nil
}

// refusal returns nil when kv is the live grant (owner, token), else why
// not: ErrStaleToken when a newer grant exists, ErrNotHeld otherwise. A nil
// kv means no grant is live; rec is consulted only when kv is non-nil.
func refusal(key string, kv *mvccpb.KeyValue, rec record, owner string, token int64) error {
	if kv == nil {
		return fmt.Errorf("%w: no live lease on key %q", store.ErrNotHeld, key)
	}
	switch live := kv.ModRevision + rec.Offset; {
	case live > token:
		return fmt.Errorf("%w: key %q has a newer grant (token %d) than token %d", store.ErrStaleToken, key, live, token)
	case live != token:
		return fmt.Errorf("%w: the live lease on key %q has token %d, not %d", store.ErrNotHeld, key, live, token)
	case rec.Owner != owner:
		return fmt.Errorf("%w: the lease on key %q with token %d is not held by %q", store.ErrNotHeld, key, token, owner)
	}
	return nil
}

// grantIs holds in a transaction exactly when ref is its key's live grant
// and was granted with offset guess.x: Release's checks without a read.
// The key's ModRevision is ref.Token - guess.x and its value is a record
// of ref.Owner with offset guess.x (ownerRange). A ref with no owner (a
// revoke naming a token) is checked on its token alone: the key is on a
// lease and holds a record, and guess is the offset key's version, which
// exists and has since before that ModRevision, as every grant records the
// offset the offset key held at its revision (offset.go). With the offset
// key absent (deleted by hand) the offset a grant recorded cannot be
// checked this way: the key is read (judge) and checked with its owner.
func (s *Store) grantIs(ref store.LeaseRef, guess offsetVersion) []clientv3.Cmp {
	k, rev := s.prefix+ref.Key, ref.Token-guess.x
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k), "=", rev)}
	if ref.Owner == "" {
		ok := s.offsetKey()
		return append(append(cmps, guess.compares(ok)...),
			clientv3.Compare(clientv3.ModRevision(ok), "<", rev),
			clientv3.Compare(clientv3.Version(ok), ">", 0),
			clientv3.Compare(clientv3.LeaseValue(k), "!=", 0),
			clientv3.Compare(clientv3.Value(k), ">", recordStart),
			clientv3.Compare(clientv3.Value(k), "<", recordEnd))
	}
	lo, hi := ownerRange(ref.Owner, guess.x)
	return append(cmps, clientv3.Compare(clientv3.Value(k), ">", lo), clientv3.Compare(clientv3.Value(k), "<", hi))
}

// judge reads the key from the Else branch of a transaction on grantIs
// (its first response). It returns why ref is not the key's live grant
// (refusal; a ref with no owner accepts any), or else ref with the owner
// read and the offset the grant was made with, for the next attempt.
func (s *Store) judge(op string, ref store.LeaseRef, resp *clientv3.TxnResponse) (store.LeaseRef, int64, error) {
	kv, rec, err := s.lockKV(op, ref.Key, resp.Responses[0].GetResponseRange().GetKvs())
	if err != nil {
		return ref, 0, err
	}
	if kv != nil && ref.Owner == "" {
		ref.Owner = rec.Owner
	}
	if err := refusal(ref.Key, kv, rec, ref.Owner, ref.Token); err != nil {
		return ref, 0, err
	}
	return ref, rec.Offset, nil
}

// revokeBestEffort revokes a lease that holds no grant anyone was told
// about (or no key any more). Failure is harmless: the lease expires after
// its TTL. It runs even when ctx has ended, on a short context of its own,
// and reports whether etcd revoked the lease (false: gone already, or the
// revocation failed).
func (s *Store) revokeBestEffort(ctx context.Context, key string, id clientv3.LeaseID) (revoked bool) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.reqTimeout)
	defer cancel()
	_, err := s.cli.Revoke(rctx, id)
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		s.log.Debug("lease revoke failed", "lock", key, "leaseId", leaseID(int64(id)), "err", err)
	}
	return err == nil
}

// fail wraps an etcd client error: with store.ErrUnavailable and the
// cause when the cluster did not answer, else with the cause alone.
func (s *Store) fail(op, key, step string, err error) error {
	what := op
	if key != "" {
		what = fmt.Sprintf("%s %q", op, key)
	}
	if IsUnavailable(err) {
		return fmt.Errorf("%w: etcdstore: %s: %s: %w", store.ErrUnavailable, what, step, err)
	}
	return fmt.Errorf("etcdstore: %s: %s: %w", what, step, err)
}

// IsUnavailable reports whether err from the etcd client means the cluster
// did not answer in time, so the outcome of the request is unknown: a
// context that ended, no endpoint reachable, no leader, a request or
// leader-change timeout, a stopped member, or etcd shedding load
// (gRPC codes Unavailable, DeadlineExceeded, Canceled, ResourceExhausted,
// and code Unknown with raft's "raft: stopped" from a member killed
// mid-request).
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || errors.Is(err, clientv3.ErrNoAvailableEndpoints) {
		return true
	}
	code, msg := codes.OK, ""
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		code, msg = ee.Code(), ee.Error()
	} else if st, ok := status.FromError(err); ok {
		code, msg = st.Code(), st.Message()
	}
	switch code {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.ResourceExhausted:
		return true
	case codes.Unknown:
		// A member stopped or killed while it handled the request answers
		// with raft's own ErrStopped, which etcd does not map to a gRPC
		// code: the proposal may or may not have been committed.
		return msg == raftStopped
	}
	return false
}

// raftStopped is the text of go.etcd.io/raft's ErrStopped as a member that
// is shutting down returns it.
const raftStopped = "raft: stopped"

// now reads the clock without its monotonic reading, so that leases compare
// by instant and print as wall time.
func (s *Store) now() time.Time { return s.clock.Now().Round(0) }

// leaseID formats an etcd lease id as etcdctl prints it.
func leaseID(id int64) string { return fmt.Sprintf("%016x", id) }
