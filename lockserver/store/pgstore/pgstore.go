// Package pgstore is the PostgreSQL implementation of store.LockStore:
// one row per lock key in table lock_lease, fencing tokens from one global
// sequence (fencing_token_seq), drawn inside the statement that wins the
// key's row, and expiry decided by lockdb's clock (lock_clock()).
//
// Open a Store with Open (cfg from DefaultConfig with the DSN set), which
// runs the embedded migrations unless cfg.SkipMigrations, and Close it when
// done. Expiry is correct only while lockdb's host clock is slewed, never
// stepped. A call that fails for want of the database wraps
// store.ErrUnavailable: the operation may or may not have taken effect.
// The design: docs/lock-service.md; the clock: docs/runbooks/lockdb-clock.md.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgerr"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The statements of the store. Each is one round trip and decides by
// lock_clock(). Their RETURNING lists match scanLease.
const (
	// acquireSQL grants the key if its row is absent or holds no unexpired
	// lease. The nextval in VALUES is used only by the first grant of a key
	// ever (rows are never deleted, so later grants take the DO UPDATE path);
	// the nextval in DO UPDATE SET runs after the row lock is won and the
	// WHERE has been re-checked on the latest row version.
	acquireSQL = `INSERT INTO lock_lease AS l (lock_key, owner_id, fencing_token, ttl_ms, granted_at, expires_at)
VALUES ($1, $2, lockdb_draw_token(0), $3::bigint, lock_clock(), lock_clock() + $3::bigint * interval '1 millisecond')
ON CONFLICT (lock_key) DO UPDATE SET
    owner_id = EXCLUDED.owner_id,
    fencing_token = lockdb_draw_token(l.fencing_token),
    ttl_ms = EXCLUDED.ttl_ms,
    granted_at = lock_clock(),
    expires_at = lock_clock() + EXCLUDED.ttl_ms * interval '1 millisecond'
WHERE l.expires_at IS NULL OR l.expires_at <= lock_clock()
RETURNING l.owner_id, l.fencing_token, l.ttl_ms, l.expires_at`

	// renewSQL extends the live lease (key, token, owner) by its TTL, and
	// returns the expiry it replaced as well (prev is the row as the
	// statement's snapshot saw it). A lease keeps its TTL across renewals,
	// so a new expiry earlier than the one replaced means lock_clock()
	// reads earlier than it did at the previous grant or renewal.
	renewSQL = `UPDATE lock_lease l
SET expires_at = lock_clock() + l.ttl_ms * interval '1 millisecond'
FROM lock_lease prev
WHERE l.lock_key = $1 AND l.fencing_token = $2 AND l.owner_id = $3 AND l.expires_at > lock_clock()
    AND prev.lock_key = l.lock_key
RETURNING l.owner_id, l.fencing_token, l.ttl_ms, l.expires_at, prev.expires_at`

	// releaseSQL ends the live lease (key, token, owner), keeping the token.
	releaseSQL = `UPDATE lock_lease
SET owner_id = NULL, expires_at = NULL
WHERE lock_key = $1 AND fencing_token = $2 AND owner_id = $3 AND expires_at > lock_clock()`

	// revokeSQL ends the live lease of the key (with $2 > 0: only if it
	// carries token $2) and returns it as it was before.
	revokeSQL = `WITH live AS (
    SELECT lock_key, owner_id, fencing_token, ttl_ms, expires_at
    FROM lock_lease
    WHERE lock_key = $1 AND expires_at > lock_clock() AND ($2::bigint = 0 OR fencing_token = $2::bigint)
    FOR UPDATE
)
UPDATE lock_lease l SET owner_id = NULL, expires_at = NULL
FROM live WHERE l.lock_key = live.lock_key
RETURNING live.owner_id, live.fencing_token, live.ttl_ms, live.expires_at`

	// inspectSQL reads the key's row and whether its lease is live.
	inspectSQL = `SELECT owner_id, fencing_token, ttl_ms, expires_at, coalesce(expires_at > lock_clock(), false)
FROM lock_lease WHERE lock_key = $1`
)

// Defaults of Config, as DefaultConfig returns them.
const (
	// DefaultMaxConns is the pool size: each call holds a connection for
	// one statement, so a few serve many requests, and small Cloud SQL
	// tiers allow only tens of connections in all. The one default of
	// lockdb's pool: lock-server's LOCKDB_MAX_CONNS defaults to it.
	DefaultMaxConns = 16
	// DefaultConnectTimeout bounds each new connection when the DSN sets no
	// connect_timeout, so a dead host is reported as unavailable instead of
	// hanging until the caller's deadline.
	DefaultConnectTimeout = 5 * time.Second
	// DefaultClockOffsetBound is the default Config.ClockOffsetBound. Two hosts
	// disciplined by NTP on one network agree within a few milliseconds;
	// 100 ms apart, at least one of them is not disciplined, and ntpd
	// corrects an offset over 128 ms with a step unless told never to.
	DefaultClockOffsetBound = 100 * time.Millisecond
)

// Log events of the store, beyond its Debug lines (docs/log-events.md).
const (
	// eventClockOffset is Open's one line about lockdb's clock: INFO, or
	// WARN when the offset exceeds Config.ClockOffsetBound.
	eventClockOffset = "lockdb_clock_offset"
	// eventClockStepped (ERROR) is a renewal that found lockdb's clock
	// earlier than at the lease's previous grant or renewal.
	eventClockStepped = "lockdb_clock_stepped"
	// eventNotDurable (ERROR) is the first grant refused because lockdb
	// runs with fsync off, after one that was not.
	eventNotDurable = "lockdb_not_durable"
)

// ErrNotDurable is returned (wrapped, with store.ErrUnavailable) by Open,
// by every grant and by Ping, and fails a new connection, while lockdb
// runs with fsync off: a commit it acknowledged could be lost in a crash,
// and the grant's token issued again after it.
var ErrNotDurable = errors.New("pgstore: lockdb does not make commits durable")

// notDurable is ErrNotDurable, and store.ErrUnavailable, with detail.
func notDurable(detail string) error {
	return fmt.Errorf("%w: %w: %s", store.ErrUnavailable, ErrNotDurable, detail)
}

// durableSQL reads fsync and makes the session's commits durable before
// they are acknowledged: a synchronous_commit of "off" (set for the
// server, the database or the role) becomes "on" for this session; any
// other value already waits for the local flush and is kept.
const durableSQL = `SELECT current_setting('fsync'), set_config('synchronous_commit',
    CASE current_setting('synchronous_commit') WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, false)`

// durable runs durableSQL on a new connection: ErrNotDurable when fsync
// is off.
func durable(ctx context.Context, conn *pgx.Conn) error {
	var fsync, syncCommit string
	if err := conn.QueryRow(ctx, durableSQL).Scan(&fsync, &syncCommit); err != nil {
		return err
	}
	if fsync != "on" || syncCommit == "off" {
		return notDurable(fmt.Sprintf("fsync is %q and synchronous_commit %q; lock-server needs fsync = on (set it in postgresql.conf or as the Cloud SQL flag)", fsync, syncCommit))
	}
	return nil
}

// ErrInvalidConfig is returned (wrapped) by Config.Validate and Open for a
// missing or malformed DSN or a field out of range.
var ErrInvalidConfig = errors.New("pgstore: invalid config")

// Config configures Open. Start from DefaultConfig: the zero value is not
// the defaults (and is not valid). Only DSN has no default.
type Config struct {
	// DSN locates lockdb: a postgres:// URL or a key=value string, as pgx
	// parses it (pool_* parameters included, except pool_max_conns, which
	// MaxConns decides). Required.
	DSN string

	// MaxConns is the most connections the store opens. Default
	// DefaultMaxConns. Must be positive.
	MaxConns int32

	// ConnectTimeout bounds each connection attempt when the DSN sets no
	// connect_timeout. Default DefaultConnectTimeout. Must be positive.
	ConnectTimeout time.Duration

	// SkipMigrations makes Open use the schema as it finds it. Default
	// false: Open applies pending migrations (Migrate) first, which is safe
	// with several lock-servers starting at once (goose takes an advisory
	// lock). Set it when the schema is managed by a separate step.
	SkipMigrations bool

	// ClockOffsetBound is how far lockdb's clock may read from this
	// process's wall clock, beyond the measurement's uncertainty, before
	// Open's log line about the clock is a warning. The offset itself does
	// not affect expiry (only lockdb's clock does); a large one suggests a
	// clock that is not disciplined and may yet be stepped. Default
	// DefaultClockOffsetBound. Must be positive.
	ClockOffsetBound time.Duration

	// AcceptPromotion lets grants go on after lockdb fails over to a
	// promoted synchronous standby (promotion.go): when the restore guard
	// finds lockdb on a later timeline of the same cluster, database and
	// sequence, and this store saw the stamped timeline's commits waiting
	// for a standby, the stamp is moved to the new timeline instead of
	// refusing grants until lockctl advance. Default false: every new
	// timeline is treated as a restore. Set it only when lockdb's standby
	// is synchronous (synchronous_standby_names naming it); with it set,
	// the store checks that every ReplicationCheckInterval and logs
	// lockdb_replication_async when it is not so.
	AcceptPromotion bool

	// ReplicationCheckInterval is how often, with AcceptPromotion, the
	// store reads lockdb's replication settings. Default
	// DefaultReplicationCheckInterval. Must be positive when
	// AcceptPromotion is set.
	ReplicationCheckInterval time.Duration
}

// DefaultConfig returns the defaults documented on Config; DSN is left
// empty (required).
func DefaultConfig() Config {
	return Config{MaxConns: DefaultMaxConns, ConnectTimeout: DefaultConnectTimeout, ClockOffsetBound: DefaultClockOffsetBound,
		ReplicationCheckInterval: DefaultReplicationCheckInterval}
}

// Validate returns nil or one error per invalid field, joined
// (errors.Join), each wrapping ErrInvalidConfig. It does not contact the
// database.
func (c Config) Validate() error {
	_, err := c.poolConfig()
	return err
}

func (c Config) poolConfig() (*pgxpool.Config, error) {
	var errs []error
	if c.MaxConns <= 0 {
		errs = append(errs, fmt.Errorf("%w: MaxConns is %d; want a positive number (default %d)", ErrInvalidConfig, c.MaxConns, DefaultMaxConns))
	}
	if c.ClockOffsetBound <= 0 {
		errs = append(errs, fmt.Errorf("%w: ClockOffsetBound is %v; want a positive duration (default %v)", ErrInvalidConfig, c.ClockOffsetBound, DefaultClockOffsetBound))
	}
	if c.ConnectTimeout <= 0 {
		errs = append(errs, fmt.Errorf("%w: ConnectTimeout is %v; want a positive duration (default %v)", ErrInvalidConfig, c.ConnectTimeout, DefaultConnectTimeout))
	}
	if c.AcceptPromotion && c.ReplicationCheckInterval <= 0 {
		errs = append(errs, fmt.Errorf("%w: ReplicationCheckInterval is %v; want a positive duration with AcceptPromotion (default %v)", ErrInvalidConfig, c.ReplicationCheckInterval, DefaultReplicationCheckInterval))
	}
	var pc *pgxpool.Config
	if c.DSN == "" {
		errs = append(errs, fmt.Errorf("%w: DSN is empty", ErrInvalidConfig))
	} else {
		var err error
		if pc, err = pgxpool.ParseConfig(c.DSN); err != nil {
			// pgx's message does not repeat the password.
			errs = append(errs, fmt.Errorf("%w: DSN: %v", ErrInvalidConfig, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	pc.MaxConns = c.MaxConns
	pc.AfterConnect = durable
	if pc.ConnConfig.ValidateConnect == nil {
		// Only a server out of recovery (target_session_attrs=primary
		// unless the DSN asks read-write): a standby would refuse every
		// write, and answer Inspect from a copy that may lag the
		// primary.
		pc.ConnConfig.ValidateConnect = pgconn.ValidateConnectTargetSessionAttrsPrimary
	}
	if pc.ConnConfig.ConnectTimeout == 0 {
		pc.ConnConfig.ConnectTimeout = c.ConnectTimeout
	}
	// No pre-use check of our own beyond pgxpool's (it pings a connection
	// idle for more than a second): a connection the server closed
	// (restart, failover) that was used more recently fails its next call
	// with ErrUnavailable and is discarded, and the caller retries (the SDK
	// does). A socket peek here once deadlocked against pgconn's background
	// reader, which can hold the socket's read lock on an idle connection
	// after a slow write.
	return pc, nil
}

// Store is a LockStore over PostgreSQL. It is safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
	log  *slog.Logger
	dsn  string

	// acquireSQL is the acquire statement; tests swap in a broken one to
	// show that the token-regression test can fail.
	acquireSQL string
	// acquireManySQL is the group-grant statement (batch.go), swapped the
	// same way.
	acquireManySQL string

	// acceptPromotions is Config.AcceptPromotion (promotion.go).
	acceptPromotions bool
	// replMu guards syncByTimeline: per timeline, whether the last
	// replication check on it found commits waiting for a standby.
	replMu         sync.Mutex
	syncByTimeline map[int64]bool
	// stopWatch stops the replication watcher; watchDone is closed when it
	// has exited. Both nil without AcceptPromotion.
	stopWatch, watchDone chan struct{}
	closeOnce            sync.Once

	// refusingNotDurable is set by a grant refused for fsync off and
	// cleared by one that is not, so that eventNotDurable is logged once
	// per spell.
	refusingNotDurable atomic.Bool
}

var _ store.LockStore = (*Store)(nil)

// Open connects to the database of cfg.DSN, applies pending migrations
// unless cfg.SkipMigrations, checks the database answers, and logs one
// line about lockdb's clock (event lockdb_clock_offset: INFO, WARN when the
// offset exceeds cfg.ClockOffsetBound). Later, logger receives Debug events
// and, at ERROR, lockdb_clock_stepped (nil: discard). Errors wrap
// ErrInvalidConfig for a bad cfg, store.ErrUnavailable when the
// database cannot be reached within ctx or the connect timeout, or are
// migration failures (or, with SkipMigrations, a schema without
// lock_clock()).
func Open(ctx context.Context, cfg Config, logger *slog.Logger) (*Store, error) {
	pc, err := cfg.poolConfig()
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if !cfg.SkipMigrations {
		if err := Migrate(ctx, cfg.DSN); err != nil {
			return nil, err
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("pgstore: open pool: %w", err)
	}
	s := &Store{pool: pool, log: logger, dsn: cfg.DSN, acquireSQL: acquireSQL, acquireManySQL: acquireManySQL,
		acceptPromotions: cfg.AcceptPromotion, syncByTimeline: map[int64]bool{}}
	if err := s.Ping(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	if err := s.logClock(ctx, cfg.ClockOffsetBound); err != nil {
		pool.Close()
		return nil, err
	}
	if cfg.AcceptPromotion {
		if _, err := s.CheckReplication(ctx); err != nil {
			pool.Close()
			return nil, err
		}
		s.stopWatch, s.watchDone = make(chan struct{}), make(chan struct{})
		go func() {
			defer close(s.watchDone)
			s.watchReplication(cfg.ReplicationCheckInterval, s.stopWatch)
		}()
	}
	logger.Debug("pgstore opened", "max_conns", pc.MaxConns)
	return s, nil
}

// ClockOffset reads lock_clock(), the clock that decides expiry, once and
// returns how far it is ahead of this process's wall clock (negative:
// behind), measured against the midpoint of the round trip, and the
// uncertainty of that figure (half the round trip). Errors wrap
// store.ErrUnavailable when the database does not answer.
func (s *Store) ClockOffset(ctx context.Context) (offset, uncertainty time.Duration, err error) {
	var db time.Time
	sent := time.Now()
	if err := s.pool.QueryRow(ctx, `SELECT lock_clock()`).Scan(&db); err != nil {
		return 0, 0, unavailable("read lockdb's clock", "", err)
	}
	rtt := time.Since(sent) // monotonic
	// db carries no monotonic reading, so Sub compares wall clocks.
	return db.Sub(sent.Add(rtt / 2)), rtt / 2, nil
}

// logClock logs, once, the contract of expiry and lockdb's clock offset:
// INFO, or WARN when the offset is certainly larger than bound.
func (s *Store) logClock(ctx context.Context, bound time.Duration) error {
	offset, uncertainty, err := s.ClockOffset(ctx)
	if err != nil {
		return err
	}
	level, msg := slog.LevelInfo, "lease expiry is decided by lockdb's wall clock (lock_clock()), which must be disciplined by slewing only, never stepped"
	if offset.Abs()-uncertainty > bound {
		level, msg = slog.LevelWarn, msg+"; lockdb's clock is further from this host's than the bound: check both hosts' clock discipline (docs/runbooks/lockdb-clock.md)"
	}
	s.log.Log(ctx, level, msg, "event", eventClockOffset,
		"offsetMs", float64(offset.Microseconds())/1000, "uncertaintyMs", float64(uncertainty.Microseconds())/1000,
		"boundMs", bound.Milliseconds())
	return nil
}

// unavailable wraps err, a failure of op, in store.ErrUnavailable when it
// is a failure to reach the database, and in a plain error otherwise (an
// error from PostgreSQL about the statement itself: a bug).
func unavailable(op, key string, err error) error {
	what := op
	if key != "" {
		what = fmt.Sprintf("%s %q", op, key)
	}
	if !pgerr.Unavailable(err) {
		return fmt.Errorf("pgstore: %s: %w", what, err)
	}
	return fmt.Errorf("%w: pgstore: %s (outcome unknown): %w", store.ErrUnavailable, what, err)
}

func leaseOf(key, owner string, token, ttlMs int64, expiresAt time.Time) store.Lease {
	return store.Lease{
		Key: key, Owner: owner, Token: token,
		LeaseID:   "pg-" + strconv.FormatInt(token, 10),
		TTL:       time.Duration(ttlMs) * time.Millisecond,
		ExpiresAt: expiresAt.UTC(),
	}
}

// scanLease reads a RETURNING owner_id, fencing_token, ttl_ms, expires_at row.
func scanLease(row pgx.Row, key string) (store.Lease, error) {
	var (
		owner      string
		token, ttl int64
		expires    time.Time
	)
	if err := row.Scan(&owner, &token, &ttl, &expires); err != nil {
		return store.Lease{}, err
	}
	return leaseOf(key, owner, token, ttl, expires), nil
}

// Acquire implements store.LockStore in one statement, which draws the
// token only after it has won the key's row, preceded in the same round trip
// by the restore guard's identity check. ErrLockHeld, wrapped, when an
// unexpired lease exists on key; ErrBackendRestored when lockdb is not the
// instance its identity stamp names; ErrInvalidArgument; ErrUnavailable.
func (s *Store) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (store.Lease, error) {
	if err := store.ValidateAcquire(key, owner, ttl); err != nil {
		return store.Lease{}, err
	}
	l, err := s.guardedAcquire(ctx, key, owner, ttl) // the restore guard: guard.go
	if s.promoted(ctx, err) {                        // a promoted synchronous standby: promotion.go
		l, err = s.guardedAcquire(ctx, key, owner, ttl)
	}
	if errors.Is(err, store.ErrBackendRestored) {
		return store.Lease{}, err
	}
	if errors.Is(err, pgx.ErrNoRows) {
		s.log.Debug("pgstore acquire refused", "lock", key, "owner", owner)
		return store.Lease{}, fmt.Errorf("%w: key %q has an unexpired lease", store.ErrLockHeld, key)
	}
	if err != nil {
		return store.Lease{}, unavailable("acquire", key, err)
	}
	s.log.Debug("pgstore granted", "lock", key, "owner", owner, "token", l.Token, "ttl_ms", ttl.Milliseconds())
	return l, nil
}

// refusal explains why (key, owner, token) matched no live lease, reading
// the key's row after the refused statement: ErrStaleToken when the row
// carries a newer token, else ErrNotHeld.
func (s *Store) refusal(ctx context.Context, op, key, owner string, token int64) error {
	var last int64
	err := s.pool.QueryRow(ctx, `SELECT fencing_token FROM lock_lease WHERE lock_key = $1`, key).Scan(&last)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return unavailable(op, key, err)
	}
	s.log.Debug("pgstore "+op+" refused", "lock", key, "owner", owner, "token", token, "last_token", last)
	if last > token {
		return fmt.Errorf("%w: key %q has a newer grant (token %d) than token %d", store.ErrStaleToken, key, last, token)
	}
	return fmt.Errorf("%w: no live lease on key %q for owner %q with token %d (last token of the key: %d)", store.ErrNotHeld, key, owner, token, last)
}

// Renew implements store.LockStore: it extends the live lease by its
// TTL from the database's clock now. ErrStaleToken, ErrNotHeld (wrapped,
// naming both tokens), ErrInvalidArgument, ErrUnavailable.
func (s *Store) Renew(ctx context.Context, key, owner string, token int64) (store.Lease, error) {
	if err := store.ValidateLease(key, owner, token); err != nil {
		return store.Lease{}, err
	}
	var (
		ttl           int64
		expires, prev time.Time
	)
	err := s.pool.QueryRow(ctx, renewSQL, key, token, owner).Scan(new(string), new(int64), &ttl, &expires, &prev)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Lease{}, s.refusal(ctx, "renew", key, owner, token)
	}
	if err != nil {
		return store.Lease{}, unavailable("renew", key, err)
	}
	if expires.Before(prev) {
		s.log.Error("lockdb's clock went back: a renewal's expiry is earlier than the one it replaced; expiry requires a clock that is slewed, never stepped (docs/runbooks/lockdb-clock.md)",
			"event", eventClockStepped, "lock", key, "owner", owner, "token", token,
			"expiresAt", expires.UTC(), "previousExpiresAt", prev.UTC(), "steppedBackAtLeastMs", prev.Sub(expires).Milliseconds())
	}
	l := leaseOf(key, owner, token, ttl, expires)
	s.log.Debug("pgstore renewed", "lock", key, "owner", owner, "token", token)
	return l, nil
}

// Release implements store.LockStore: the row keeps the token, owner
// and expiry become NULL. ErrStaleToken, ErrNotHeld (wrapped, naming both
// tokens), ErrInvalidArgument, ErrUnavailable.
func (s *Store) Release(ctx context.Context, key, owner string, token int64) error {
	if err := store.ValidateLease(key, owner, token); err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, releaseSQL, key, token, owner)
	if err != nil {
		return unavailable("release", key, err)
	}
	if tag.RowsAffected() == 0 {
		return s.refusal(ctx, "release", key, owner, token)
	}
	s.log.Debug("pgstore released", "lock", key, "owner", owner, "token", token)
	return nil
}

// Revoke implements store.LockStore: it ends the live lease of key
// (with token > 0, only if the live lease carries that token) and returns
// it as it was. ErrNotHeld when no lease is live; ErrStaleToken when a
// lease with a newer token than a given one is live; ErrInvalidArgument;
// ErrUnavailable.
func (s *Store) Revoke(ctx context.Context, key string, token int64) (store.Lease, error) {
	if err := store.ValidateKey(key); err != nil {
		return store.Lease{}, err
	}
	if err := store.ValidateRevokeToken(token); err != nil {
		return store.Lease{}, err
	}
	l, err := scanLease(s.pool.QueryRow(ctx, revokeSQL, key, token), key)
	if errors.Is(err, pgx.ErrNoRows) {
		st, err := s.Inspect(ctx, key)
		if err != nil {
			return store.Lease{}, err
		}
		if st.Lease != nil && token != 0 && st.Lease.Token > token {
			return store.Lease{}, fmt.Errorf("%w: key %q is held with token %d, newer than %d", store.ErrStaleToken, key, st.Lease.Token, token)
		}
		if st.Lease != nil && token != 0 {
			return store.Lease{}, fmt.Errorf("%w: key %q is held with token %d, not %d", store.ErrNotHeld, key, st.Lease.Token, token)
		}
		return store.Lease{}, fmt.Errorf("%w: no live lease on key %q (last token: %d)", store.ErrNotHeld, key, st.LastToken)
	}
	if err != nil {
		return store.Lease{}, unavailable("revoke", key, err)
	}
	s.log.Debug("pgstore revoked", "lock", key, "owner", l.Owner, "token", l.Token)
	return l, nil
}

// Inspect implements store.LockStore: the live lease by the database's
// clock, and LastToken from the key's row (0 if the key was never granted).
// ErrInvalidArgument, ErrUnavailable.
func (s *Store) Inspect(ctx context.Context, key string) (store.State, error) {
	if err := store.ValidateKey(key); err != nil {
		return store.State{}, err
	}
	var (
		owner      *string
		token, ttl int64
		expires    *time.Time
		live       bool
	)
	err := s.pool.QueryRow(ctx, inspectSQL, key).Scan(&owner, &token, &ttl, &expires, &live)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.State{Key: key}, nil
	}
	if err != nil {
		return store.State{}, unavailable("inspect", key, err)
	}
	st := store.State{Key: key, LastToken: token}
	if live && owner != nil && expires != nil {
		l := leaseOf(key, *owner, token, ttl, *expires)
		st.Lease = &l
	}
	return st, nil
}

// Ping implements store.LockStore: nil when the database answers within
// ctx that it runs with fsync on; an error wrapping ErrNotDurable when it
// runs with fsync off (grants are refused then); else an error wrapping
// ErrUnavailable.
func (s *Store) Ping(ctx context.Context) error {
	var fsync string
	if err := s.pool.QueryRow(ctx, `SELECT current_setting('fsync')`).Scan(&fsync); err != nil {
		return unavailable("ping", "", err)
	}
	if fsync != "on" {
		return notDurable(fmt.Sprintf("fsync is %q; grants are refused until it is on", fsync))
	}
	return nil
}

// Close implements store.LockStore: it closes the pool, waiting for
// connections in use to be returned. Leases stay in the database. Closing
// twice is harmless; other calls after Close return ErrUnavailable.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		if s.stopWatch != nil {
			close(s.stopWatch)
			<-s.watchDone
		}
	})
	s.pool.Close()
	return nil
}
