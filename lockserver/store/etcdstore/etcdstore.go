// Package etcdstore is the etcd lockserver.LockStore, over
// go.etcd.io/etcd/client/v3.
//
// Layout. A lock key k is the etcd key Prefix+k, present exactly while the
// lock is held. Its value is a small JSON record {"owner", "ttlMs"} (the
// granted TTL); the etcd lease it is attached to is the grant's lease, read
// from the KeyValue. One etcd lease is granted per lock grant and never
// reused, so a late renewal or revocation naming an old lease can never
// touch a newer holder.
//
// Tokens. Acquire grants a lease, then runs one transaction:
//
//	If(CreateRevision(Prefix+k) == 0)
//	Then(Put(Prefix+k, record, WithLease(lease)))
//	Else(Get(Prefix+k))
//
// The fencing token is the revision of the winning transaction
// (resp.Header.Revision), which is also the key's ModRevision while the
// grant lives, since the key is never written again. etcd's revision is one
// counter for the whole cluster, raft-replicated and persisted, so tokens
// strictly increase across grants of every key, across restarts of
// lock-server and of etcd members, and across leader changes. Renew,
// Release and conditional Revoke identify the grant by comparing the key's
// ModRevision with the token presented.
//
// Expiry. etcd decides: the leader's lessor revokes a lease when its TTL
// runs out without a keep-alive, and the revocation deletes the key. TTLs
// are whole seconds (a request is rounded up) and etcd raises any TTL below
// its floor (1.5 election timeouts, 2 s with etcd's default timing, 1 s
// with etcd/embedded's); Lease.TTL is what etcd granted. Lease.ExpiresAt is
// computed by lock-server: its own clock read just before the grant or
// keep-alive request was sent, plus the granted TTL. That is a lower bound:
// etcd starts the TTL later than that, and a leader change re-arms the
// remaining TTL of every lease (etcd extends leases when a new leader
// takes over), so etcd may expire a lease later than ExpiresAt, never
// earlier (up to the rate difference of the two clocks).
//
// Inspect reports a lease as live while its key exists: between the TTL
// running out and the leader's revocation (etcd checks every 500 ms) the
// key still exists and Acquire still refuses, so Inspect agrees with
// Acquire rather than with the clock. After the key is deleted etcd forgets
// it: Inspect reports LastToken 0 for a key whose lease has ended. The
// cluster revision is still monotonic, so later tokens are larger anyway.
//
// Errors. Refusals wrap lockserver.ErrLockHeld, ErrNotHeld, ErrStaleToken;
// arguments are checked with lockserver's validators first
// (ErrInvalidArgument). An unreachable cluster, a lost leader, a request
// timeout or the caller's context ending wrap lockserver.ErrUnavailable
// together with the cause; the operation may or may not have taken effect.
package etcdstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
)

// Defaults applied to zero Config fields.
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
)

// ErrInvalidConfig is returned, wrapped, by Config.Validate, Open and New.
var ErrInvalidConfig = errors.New("etcdstore: invalid config")

// Clock is lock-server's time source, read to compute Lease.ExpiresAt.
type Clock interface {
	Now() time.Time
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// Config configures a Store. Open and New do not modify it.
type Config struct {
	// Endpoints are the etcd client URLs ("http://127.0.0.1:2379"). Required
	// by Open; ignored by New.
	Endpoints []string

	// Prefix is prepended to every lock key. It must end with "/" so that
	// no prefix is a prefix of another's keys. Default DefaultPrefix. Two
	// lock-servers share locks exactly when they share endpoints and Prefix.
	Prefix string

	// DialTimeout bounds the client's setup calls and derives its first
	// keep-alive timeout (clientv3.Config.DialTimeout); creating the client
	// does not block on it. Default DefaultDialTimeout.
	DialTimeout time.Duration

	// RequestTimeout bounds each store method, all its etcd calls included,
	// on top of the caller's context. Default DefaultRequestTimeout.
	RequestTimeout time.Duration

	// ReconnectMaxDelay caps the gRPC reconnect backoff of a client made by
	// Open. Default DefaultReconnectMaxDelay.
	ReconnectMaxDelay time.Duration

	// Clock is read for ExpiresAt. Default the wall clock.
	Clock Clock

	// EtcdLogger receives the etcd client's own logs. Nil: discarded (the
	// store reports every failure in its returned errors).
	EtcdLogger *zap.Logger
}

func (c Config) withDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.ReconnectMaxDelay == 0 {
		c.ReconnectMaxDelay = DefaultReconnectMaxDelay
	}
	if c.Clock == nil {
		c.Clock = wallClock{}
	}
	if c.EtcdLogger == nil {
		c.EtcdLogger = zap.NewNop()
	}
	return c
}

// Validate reports, wrapping ErrInvalidConfig, the first field out of range
// after defaults are applied, Endpoints included (as Open needs them).
func (c Config) Validate() error {
	if err := c.validate(); err != nil {
		return err
	}
	if len(c.Endpoints) == 0 {
		return fmt.Errorf("%w: no endpoints", ErrInvalidConfig)
	}
	for _, ep := range c.Endpoints {
		if ep == "" {
			return fmt.Errorf("%w: empty endpoint", ErrInvalidConfig)
		}
	}
	return nil
}

// validate checks everything but Endpoints (New takes a client instead).
func (c Config) validate() error {
	c = c.withDefaults()
	switch {
	case !strings.HasSuffix(c.Prefix, "/"):
		return fmt.Errorf("%w: prefix %q does not end with /", ErrInvalidConfig, c.Prefix)
	case c.DialTimeout < 0:
		return fmt.Errorf("%w: dial timeout %v is negative", ErrInvalidConfig, c.DialTimeout)
	case c.RequestTimeout < 0:
		return fmt.Errorf("%w: request timeout %v is negative", ErrInvalidConfig, c.RequestTimeout)
	case c.ReconnectMaxDelay < 0:
		return fmt.Errorf("%w: reconnect max delay %v is negative", ErrInvalidConfig, c.ReconnectMaxDelay)
	}
	return nil
}

// Store is the etcd LockStore. It is safe for concurrent use, keeps no lock
// state of its own and starts no goroutines (the etcd client it owns has
// its own, ended by Close).
type Store struct {
	cli        *clientv3.Client
	ownsClient bool
	prefix     string
	reqTimeout time.Duration
	clock      Clock
	log        *slog.Logger

	closeOnce sync.Once
	closeErr  error
}

var _ lockserver.LockStore = (*Store)(nil)

// record is the value of a lock key.
type record struct {
	Owner string `json:"owner"`
	TTLMs int64  `json:"ttlMs"`
}

// Open connects to the cluster at cfg.Endpoints and returns a Store that
// owns the client (Close closes it). It returns once the cluster answered a
// linearizable read, bounded by ctx (ErrUnavailable otherwise), so a wrong
// endpoint fails here rather than at the first lock request. logger may be
// nil (discard).
func Open(ctx context.Context, cfg Config, logger *slog.Logger) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   append([]string(nil), cfg.Endpoints...),
		DialTimeout: cfg.DialTimeout,
		Logger:      cfg.EtcdLogger,
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
		return nil, err
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
	return newStore(cli, false, cfg.withDefaults(), logger), nil
}

func newStore(cli *clientv3.Client, owns bool, cfg Config, logger *slog.Logger) *Store {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Store{
		cli: cli, ownsClient: owns, prefix: cfg.Prefix,
		reqTimeout: cfg.RequestTimeout, clock: cfg.Clock,
		log: logger.With("store", "etcd", "prefix", cfg.Prefix),
	}
}

// Acquire implements lockserver.LockStore: it grants an etcd lease of
// ceil(ttl) seconds (etcd may raise it to its floor; Lease.TTL is the
// granted TTL), then creates the key with that lease in one transaction
// that succeeds only if the key does not exist. The token is the revision
// of that transaction. If the key exists, the new lease is revoked (best
// effort; otherwise it expires unused) and ErrLockHeld is returned.
func (s *Store) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (lockserver.Lease, error) {
	if err := lockserver.ValidateAcquire(key, owner, ttl); err != nil {
		return lockserver.Lease{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()

	secs := int64((ttl + time.Second - 1) / time.Second)
	sent := s.now()
	g, err := s.cli.Grant(ctx, secs)
	if err != nil {
		return lockserver.Lease{}, s.fail("acquire", key, "grant lease", err)
	}
	granted := time.Duration(g.TTL) * time.Second
	val, err := json.Marshal(record{Owner: owner, TTLMs: granted.Milliseconds()})
	if err != nil {
		s.revokeBestEffort(ctx, key, g.ID)
		return lockserver.Lease{}, fmt.Errorf("etcdstore: acquire %q: encode record: %w", key, err)
	}
	k := s.prefix + key
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(val), clientv3.WithLease(g.ID))).
		Else(clientv3.OpGet(k)).
		Commit()
	if err != nil {
		// The transaction may have applied. Revoking its lease ends the
		// grant either way, so the caller's "unknown" is at worst a grant
		// that nobody holds for less than a TTL.
		s.revokeBestEffort(ctx, key, g.ID)
		return lockserver.Lease{}, s.fail("acquire", key, "create key", err)
	}
	if !resp.Succeeded {
		s.revokeBestEffort(ctx, key, g.ID)
		var holder *mvccpb.KeyValue
		if rr := resp.Responses[0].GetResponseRange(); rr != nil && len(rr.Kvs) > 0 {
			holder = rr.Kvs[0]
		}
		if holder == nil {
			return lockserver.Lease{}, fmt.Errorf("%w: key %q", lockserver.ErrLockHeld, key)
		}
		return lockserver.Lease{}, fmt.Errorf("%w: key %q is held with token %d", lockserver.ErrLockHeld, key, holder.ModRevision)
	}
	return lockserver.Lease{
		Key: key, Owner: owner, Token: resp.Header.Revision,
		LeaseID: leaseID(int64(g.ID)), TTL: granted, ExpiresAt: sent.Add(granted),
	}, nil
}

// Renew implements lockserver.LockStore: it reads the key, checks that its
// ModRevision equals token and its owner matches, then sends one keep-alive
// for the grant's lease. etcd refuses a keep-alive for a lease that has
// expired or been revoked (ErrNotHeld), even one not yet deleted, so a
// renewal never resurrects a lease. The returned ExpiresAt is lock-server's
// clock just before the keep-alive plus the TTL etcd reports.
func (s *Store) Renew(ctx context.Context, key, owner string, token int64) (lockserver.Lease, error) {
	if err := lockserver.ValidateLease(key, owner, token); err != nil {
		return lockserver.Lease{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()

	kv, rec, err := s.get(ctx, "renew", key)
	if err != nil {
		return lockserver.Lease{}, err
	}
	if err := refusal(key, kv, rec, owner, token); err != nil {
		return lockserver.Lease{}, err
	}
	sent := s.now()
	ka, err := s.cli.KeepAliveOnce(ctx, clientv3.LeaseID(kv.Lease))
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return lockserver.Lease{}, fmt.Errorf("%w: lease of key %q with token %d has ended", lockserver.ErrNotHeld, key, token)
	}
	if err != nil {
		return lockserver.Lease{}, s.fail("renew", key, "keep-alive", err)
	}
	ttl := time.Duration(ka.TTL) * time.Second
	return lockserver.Lease{
		Key: key, Owner: owner, Token: token,
		LeaseID: leaseID(kv.Lease), TTL: ttl, ExpiresAt: sent.Add(ttl),
	}, nil
}

// Release implements lockserver.LockStore: after checking owner and token
// on a linearizable read, it revokes the grant's own etcd lease, which
// deletes the key in the same write. A release therefore never removes a
// newer grant: that grant has a lease of its own. ErrStaleToken, ErrNotHeld
// (also when the lease ends between the read and the revoke),
// ErrInvalidArgument, ErrUnavailable.
func (s *Store) Release(ctx context.Context, key, owner string, token int64) error {
	if err := lockserver.ValidateLease(key, owner, token); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()

	kv, rec, err := s.get(ctx, "release", key)
	if err != nil {
		return err
	}
	if err := refusal(key, kv, rec, owner, token); err != nil {
		return err
	}
	// Revoking the grant's own lease deletes its key, in one write. Lease ids
	// are unique per grant, so even if the lease ended and the key was
	// granted again since the read above, this cannot touch the new grant.
	if _, err := s.cli.Revoke(ctx, clientv3.LeaseID(kv.Lease)); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			now, nrec, gerr := s.get(ctx, "release", key)
			if gerr != nil {
				return gerr
			}
			if rerr := refusal(key, now, nrec, owner, token); rerr != nil {
				return rerr
			}
			return fmt.Errorf("%w: the lease of key %q with token %d ended before the release", lockserver.ErrNotHeld, key, token)
		}
		return s.fail("release", key, "revoke lease", err)
	}
	return nil
}

// Revoke implements lockserver.LockStore: it revokes the etcd lease of the
// live grant, which deletes the key. With token > 0 it does so only if the
// key's ModRevision equals token (ErrStaleToken if a newer grant is live,
// ErrNotHeld if an older one is). The returned lease is the revoked grant,
// with ExpiresAt set to lock-server's clock just before the revocation was
// sent.
func (s *Store) Revoke(ctx context.Context, key string, token int64) (lockserver.Lease, error) {
	if err := lockserver.ValidateKey(key); err != nil {
		return lockserver.Lease{}, err
	}
	if err := lockserver.ValidateRevokeToken(token); err != nil {
		return lockserver.Lease{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()

	kv, rec, err := s.get(ctx, "revoke", key)
	if err != nil {
		return lockserver.Lease{}, err
	}
	if kv == nil {
		return lockserver.Lease{}, fmt.Errorf("%w: no live lease on key %q", lockserver.ErrNotHeld, key)
	}
	if token != 0 {
		if err := refusal(key, kv, rec, rec.Owner, token); err != nil {
			return lockserver.Lease{}, err
		}
	}
	sent := s.now()
	if _, err := s.cli.Revoke(ctx, clientv3.LeaseID(kv.Lease)); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return lockserver.Lease{}, fmt.Errorf("%w: lease of key %q with token %d ended before the revoke", lockserver.ErrNotHeld, key, kv.ModRevision)
		}
		return lockserver.Lease{}, s.fail("revoke", key, "revoke lease", err)
	}
	return lockserver.Lease{
		Key: key, Owner: rec.Owner, Token: kv.ModRevision,
		LeaseID: leaseID(kv.Lease), TTL: time.Duration(rec.TTLMs) * time.Millisecond, ExpiresAt: sent,
	}, nil
}

// Inspect implements lockserver.LockStore: it reads the key and, if
// present, asks the leader for its lease's remaining TTL. The lease is
// reported live while the key exists (see the package doc); ExpiresAt is
// lock-server's clock before the TTL query plus the remaining TTL, which
// etcd truncates to whole seconds, so it is a lower bound that moves
// between calls. LastToken is the key's ModRevision while it exists, and 0
// once etcd has deleted it.
func (s *Store) Inspect(ctx context.Context, key string) (lockserver.State, error) {
	if err := lockserver.ValidateKey(key); err != nil {
		return lockserver.State{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()

	st := lockserver.State{Key: key}
	kv, rec, err := s.get(ctx, "inspect", key)
	if err != nil || kv == nil {
		return st, err
	}
	st.LastToken = kv.ModRevision
	sent := s.now()
	ttl, err := s.cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
	if err != nil {
		return lockserver.State{}, s.fail("inspect", key, "lease time to live", err)
	}
	if ttl.TTL < 0 {
		// The lease is gone, and with it the key: the revocation was
		// applied between the two reads (the leader answers TimeToLive
		// only after applying everything it has committed).
		return st, nil
	}
	granted := time.Duration(ttl.GrantedTTL) * time.Second
	if granted == 0 {
		granted = time.Duration(rec.TTLMs) * time.Millisecond
	}
	st.Lease = &lockserver.Lease{
		Key: key, Owner: rec.Owner, Token: kv.ModRevision, LeaseID: leaseID(kv.Lease),
		TTL: granted, ExpiresAt: sent.Add(time.Duration(ttl.TTL) * time.Second),
	}
	return st, nil
}

// Ping implements lockserver.LockStore with a linearizable read of one key,
// which needs a leader and a quorum, bounded by RequestTimeout.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	if _, err := s.cli.Get(ctx, s.prefix, clientv3.WithCountOnly()); err != nil {
		return s.fail("ping", "", "read", err)
	}
	return nil
}

// Close implements lockserver.LockStore: it closes the client if Open
// created it. Leases are not touched. Calling it again returns the first
// result.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		if s.ownsClient {
			if err := s.cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
				s.closeErr = fmt.Errorf("etcdstore: close client: %w", err)
			}
		}
	})
	return s.closeErr
}

// get reads the key linearizably; kv is nil when it does not exist.
func (s *Store) get(ctx context.Context, op, key string) (*mvccpb.KeyValue, record, error) {
	resp, err := s.cli.Get(ctx, s.prefix+key)
	if err != nil {
		return nil, record{}, s.fail(op, key, "read key", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, record{}, nil
	}
	kv := resp.Kvs[0]
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
	switch {
	case kv == nil:
		return fmt.Errorf("%w: no live lease on key %q", lockserver.ErrNotHeld, key)
	case kv.ModRevision > token:
		return fmt.Errorf("%w: key %q was granted again with token %d, after token %d", lockserver.ErrStaleToken, key, kv.ModRevision, token)
	case kv.ModRevision != token:
		return fmt.Errorf("%w: the live lease on key %q has token %d, not %d", lockserver.ErrNotHeld, key, kv.ModRevision, token)
	case rec.Owner != owner:
		return fmt.Errorf("%w: the lease on key %q with token %d is not held by %q", lockserver.ErrNotHeld, key, token, owner)
	}
	return nil
}

// revokeBestEffort revokes a lease that holds no grant anyone was told
// about (or no key any more). Failure is harmless: the lease expires after
// its TTL. It runs even when ctx has ended, on a short context of its own.
func (s *Store) revokeBestEffort(ctx context.Context, key string, id clientv3.LeaseID) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.reqTimeout)
	defer cancel()
	if _, err := s.cli.Revoke(rctx, id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		s.log.Debug("lease revoke failed", "lock", key, "leaseId", leaseID(int64(id)), "err", err)
	}
}

// fail wraps an etcd client error: with lockserver.ErrUnavailable and the
// cause when the cluster did not answer, else with the cause alone.
func (s *Store) fail(op, key, step string, err error) error {
	what := op
	if key != "" {
		what = fmt.Sprintf("%s %q", op, key)
	}
	if IsUnavailable(err) {
		return fmt.Errorf("%w: etcdstore: %s: %s: %w", lockserver.ErrUnavailable, what, step, err)
	}
	return fmt.Errorf("etcdstore: %s: %s: %w", what, step, err)
}

// IsUnavailable reports whether err from the etcd client means the cluster
// did not answer in time, so the outcome of the request is unknown: a
// context that ended, no endpoint reachable, no leader, a request or
// leader-change timeout, a stopped member, or etcd shedding load
// (gRPC codes Unavailable, DeadlineExceeded, Canceled, ResourceExhausted).
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || errors.Is(err, clientv3.ErrNoAvailableEndpoints) {
		return true
	}
	code := codes.OK
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		code = ee.Code()
	} else if st, ok := status.FromError(err); ok {
		code = st.Code()
	}
	switch code {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.ResourceExhausted:
		return true
	}
	return false
}

// now reads the clock without its monotonic reading, so that leases compare
// by instant and print as wall time.
func (s *Store) now() time.Time { return s.clock.Now().Round(0) }

// leaseID formats an etcd lease id as etcdctl prints it.
func leaseID(id int64) string { return fmt.Sprintf("%016x", id) }
