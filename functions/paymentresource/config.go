package paymentresource

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgpool"
)

// Defaults and bounds of Config.
const (
	// DefaultOutboxPoll is the outbox poll interval used when
	// Config.OutboxPoll is zero. A create wakes the publisher at once, so
	// the poll only matters for rows left by another instance or an earlier
	// run, and as the first retry delay after a failed publish.
	DefaultOutboxPoll = 500 * time.Millisecond
	// MinOutboxPoll and MaxOutboxPoll bound a non-zero Config.OutboxPoll:
	// below 10ms the publisher would hot-loop on the database; above ten
	// minutes a failed publish would wait too long for its retry.
	MinOutboxPoll = 10 * time.Millisecond
	// MaxOutboxPoll: see MinOutboxPoll.
	MaxOutboxPoll = 10 * time.Minute
)

// Config configures a Service. The zero value is not valid (DatabaseURL is
// required); every other field's zero value is its documented default. New
// does not modify the Config it is given.
type Config struct {
	// DatabaseURL locates paydb: a PostgreSQL URL or key=value string as
	// pgx parses it. Required. With CloudSQLInstance set, only its user,
	// password and database name are used. Env PAYDB_URL.
	DatabaseURL string
	// CloudSQLInstance, when set ("project:region:instance"), makes every
	// connection go through the Cloud SQL Go connector (see
	// internal/pgpool). Default "": connect to DatabaseURL directly. Env
	// PAYDB_INSTANCE.
	CloudSQLInstance string
	// MaxConns caps the connection pool. Default 0: pgx's default (the
	// larger of 4 and the CPU count). 1 is refused: applying migrations
	// needs a second connection while the first holds the migration lock,
	// and the outbox publisher holds one while it drains. Env
	// PAYDB_MAX_CONNS.
	MaxConns int32
	// DisableFencing turns fence point one off (the kill switch
	// payment.fencing.enabled=false): the fenced statements run without
	// their fence predicates. Default false, fencing on, so that a Config
	// built by hand is safe. Hazard: with fencing off a stale lock holder's
	// writes are accepted and the ledger can be corrupted; use it only in
	// the fencing experiment. New logs a WARN when it is set. Env
	// PAYMENT_FENCING_ENABLED=false.
	DisableFencing bool
	// OutboxPoll is how often the outbox publisher looks for unpublished
	// rows when nothing woke it, and its first retry delay after a failed
	// publish (doubling up to 30s). Default 0 means
	// DefaultOutboxPoll; otherwise MinOutboxPoll..MaxOutboxPoll. Env
	// OUTBOX_POLL_MS.
	OutboxPoll time.Duration
}

// Validate returns an error wrapping ErrInvalidConfig describing the first
// invalid field.
func (c Config) Validate() error {
	if err := c.pool().Validate(); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrInvalidConfig, api.EnvDatabaseURL, err)
	}
	if c.MaxConns == 1 {
		return fmt.Errorf("%w: MaxConns (%s) is 1; use 0 (pgx's default) or at least 2", ErrInvalidConfig, api.EnvMaxConns)
	}
	if c.OutboxPoll != 0 && (c.OutboxPoll < MinOutboxPoll || c.OutboxPoll > MaxOutboxPoll) {
		return fmt.Errorf("%w: OutboxPoll (%s) %v is outside %v..%v", ErrInvalidConfig, api.EnvOutboxPollMs, c.OutboxPoll, MinOutboxPoll, MaxOutboxPoll)
	}
	return nil
}

func (c Config) pool() pgpool.Config {
	return pgpool.Config{DSN: c.DatabaseURL, CloudSQLInstance: c.CloudSQLInstance, MaxConns: c.MaxConns}
}

func (c Config) outboxPoll() time.Duration {
	if c.OutboxPoll == 0 {
		return DefaultOutboxPoll
	}
	return c.OutboxPoll
}

// LoadConfig reads a Config from the environment through getenv (os.Getenv
// in production): PAYDB_URL, PAYDB_INSTANCE, PAYDB_MAX_CONNS,
// PAYMENT_FENCING_ENABLED, OUTBOX_POLL_MS; an unset or empty variable keeps
// the field's default. It returns the validated Config, or an error
// wrapping ErrInvalidConfig naming the offending variable.
func LoadConfig(getenv func(string) string) (Config, error) {
	c := Config{
		DatabaseURL:      strings.TrimSpace(getenv(api.EnvDatabaseURL)),
		CloudSQLInstance: strings.TrimSpace(getenv(api.EnvCloudSQLInstance)),
	}
	if v := strings.TrimSpace(getenv(api.EnvMaxConns)); v != "" {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 0 {
			return Config{}, fmt.Errorf("%w: %s=%q: want a non-negative integer", ErrInvalidConfig, api.EnvMaxConns, v)
		}
		c.MaxConns = int32(n)
	}
	on, err := fencing.Switch(api.EnvFencingEnabled, getenv(api.EnvFencingEnabled))
	if err != nil {
		return Config{}, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	c.DisableFencing = !on
	if v := strings.TrimSpace(getenv(api.EnvOutboxPollMs)); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms <= 0 || ms > int64(MaxOutboxPoll/time.Millisecond) {
			return Config{}, fmt.Errorf("%w: %s=%q: want milliseconds, %d..%d", ErrInvalidConfig, api.EnvOutboxPollMs, v,
				MinOutboxPoll.Milliseconds(), MaxOutboxPoll.Milliseconds())
		}
		c.OutboxPoll = time.Duration(ms) * time.Millisecond
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}
