package paymentresource

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/overload"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgpool"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
)

// Defaults and bounds of Config.
const (
	// DefaultOutboxPoll is DefaultConfig's Config.OutboxPoll. A create wakes the publisher at once, so
	// the poll only matters for rows left by another instance or an earlier
	// run, and as the first retry delay after a failed publish.
	DefaultOutboxPoll = 500 * time.Millisecond
	// MinOutboxPoll and MaxOutboxPoll bound Config.OutboxPoll:
	// below 10ms the publisher would hot-loop on the database; above ten
	// minutes a failed publish would wait too long for its retry.
	MinOutboxPoll = 10 * time.Millisecond
	// MaxOutboxPoll: see MinOutboxPoll.
	MaxOutboxPoll = 10 * time.Minute
)

// Config configures a Service. Start from DefaultConfig (or LoadConfig):
// the zero value is not the defaults and is not valid. New does not modify
// the Config it is given.
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
	// MaxConns caps the connection pool. Default 0, which is a value, not
	// a missing one: pgx's own default (the larger of 4 and the CPU count),
	// as for rail-proxy's pool. 1 is refused: applying migrations needs a
	// second connection while the first holds the migration lock, and the
	// outbox publisher holds one while it drains. Env PAYDB_MAX_CONNS.
	MaxConns int32
	// FencingDisabled turns fence point one off (the kill switch
	// payment.fencing.enabled=false): the fenced statements run without
	// their fence predicates. Default false, fencing on, so that a Config
	// built by hand is safe; the same field name as railproxy.Config's.
	// Hazard: with fencing off a stale lock holder's writes are accepted
	// and the ledger can be corrupted; use it only in the fencing
	// experiment. New logs a WARN when it is set. Env
	// PAYMENT_FENCING_ENABLED=false.
	FencingDisabled bool
	// OutboxPoll is how often the outbox publisher looks for unpublished
	// rows when nothing woke it, and its first retry delay after a failed
	// publish (doubling up to 30s). Default DefaultOutboxPoll; must be in
	// MinOutboxPoll..MaxOutboxPoll. Env OUTBOX_POLL_MS.
	OutboxPoll time.Duration
	// ProofKeys are the public keys of lock-server's grant proofs: a
	// fenced write is accepted only with a proof that lock-server granted
	// its token on payout:{account} (package fencing, Verify). Required
	// while fencing is on. Env LOCK_PROOF_KEYS (fenceproof VerifyKey forms,
	// comma-separated; `lockctl proof-key` makes a pair).
	ProofKeys fenceproof.Keyring
	// ReceiptKeys are the public keys of rail-proxy's receipts: an ACK or
	// DECLINE is recorded only with rail-proxy's signature over it.
	// Required. Env RAIL_RECEIPT_KEYS.
	ReceiptKeys fenceproof.Keyring
	// TermsKey signs the terms of every payout payment-resource answers
	// (api.Payout.TermsSignature, terms.go): rail-proxy forwards a
	// submission only with this signature over exactly its payout id,
	// account, amount and currency. Required; a secret. Env
	// PAYMENT_TERMS_SIGNING_KEY (a fenceproof SigningKey form; `lockctl
	// proof-key` makes one).
	TermsKey fenceproof.SigningKey
	// MaxInFlight bounds the requests served at once; one more is answered
	// 503 OVERLOADED with Retry-After at once, and nothing is done for it
	// (internal/overload). Default overload.DefaultMaxInFlight (256), far
	// above what the pool (MaxConns) serves in parallel; 1 to
	// overload.MaxMaxInFlight. Env PAYMENT_MAX_IN_FLIGHT.
	MaxInFlight int
	// StallProbeInterval is how often, while paydb is marked stalled (a
	// call ran out its whole RequestTimeout), one request is let through
	// to probe it; the others get 503 DATABASE_UNAVAILABLE with
	// Retry-After at once. Default overload.DefaultStallProbeInterval
	// (500ms); at most overload.MaxStallProbeInterval. Env
	// PAYMENT_STALL_PROBE_MS.
	StallProbeInterval time.Duration
	// StallAfter: when a paydb call has run this long and no paydb call
	// has answered since it started, and a ping on a new connection gets
	// no answer within as long either, paydb is marked stalled and every
	// running call is cut and answered 503 DATABASE_UNAVAILABLE
	// (overload.Config.StallAfter, pgpool.PingOnNewConn): a frozen paydb is answered within
	// about this, not RequestTimeout. Default overload.DefaultStallAfter
	// (1s); 0 turns it off; at most overload.MaxStallProbeInterval. The
	// audit (GET /v1/audit) is never cut by it. Env
	// PAYMENT_STALL_AFTER_MS.
	StallAfter time.Duration
	// Now is the clock of the stall probes; nil means time.Now. For tests;
	// not read from the environment.
	Now func() time.Time
}

// DefaultConfig returns the defaults documented on Config; DatabaseURL is
// left empty (required).
func DefaultConfig() Config {
	return Config{OutboxPoll: DefaultOutboxPoll, MaxInFlight: overload.DefaultMaxInFlight, StallProbeInterval: overload.DefaultStallProbeInterval,
		StallAfter: overload.DefaultStallAfter}
}

// EnvNames returns the environment variables LoadConfig reads (the
// constants of functions/paymentresource/api), for envcheck.
func EnvNames() []string {
	return []string{api.EnvDatabaseURL, api.EnvCloudSQLInstance, api.EnvMaxConns, api.EnvFencingEnabled, api.EnvOutboxPollMs,
		api.EnvProofKeys, api.EnvReceiptKeys, api.EnvTermsSigningKey, api.EnvMaxInFlight, api.EnvStallProbeMs, api.EnvStallAfterMs}
}

// Validate returns nil or one error per invalid field, joined
// (errors.Join), each wrapping ErrInvalidConfig and naming the field and
// its environment variable.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
	if c.DatabaseURL == "" {
		bad("DatabaseURL (%s) is required: a PostgreSQL DSN of paydb", api.EnvDatabaseURL)
	} else if err := (pgpool.Config{DSN: c.DatabaseURL}).Validate(); err != nil {
		bad("DatabaseURL (%s): %v", api.EnvDatabaseURL, err)
	}
	if c.MaxConns < 0 || c.MaxConns == 1 {
		bad("MaxConns (%s) is %d; use 0 (pgx's default) or at least 2", api.EnvMaxConns, c.MaxConns)
	}
	if c.OutboxPoll < MinOutboxPoll || c.OutboxPoll > MaxOutboxPoll {
		bad("OutboxPoll (%s) %v is outside %v..%v", api.EnvOutboxPollMs, c.OutboxPoll, MinOutboxPoll, MaxOutboxPoll)
	}
	if c.ProofKeys.Len() == 0 && !c.FencingDisabled {
		bad("ProofKeys (%s) is required while fencing is on: lock-server's public keys (lockctl proof-key makes a pair)", api.EnvProofKeys)
	}
	if c.ReceiptKeys.Len() == 0 {
		bad("ReceiptKeys (%s) is required: rail-proxy's public receipt keys", api.EnvReceiptKeys)
	}
	if c.TermsKey.IsZero() {
		bad("TermsKey (%s) is required: the secret key payment-resource signs its payouts' terms with (lockctl proof-key makes one)", api.EnvTermsSigningKey)
	}
	if c.MaxInFlight < 1 || c.MaxInFlight > overload.MaxMaxInFlight {
		bad("MaxInFlight (%s) %d is outside 1..%d", api.EnvMaxInFlight, c.MaxInFlight, overload.MaxMaxInFlight)
	}
	if c.StallProbeInterval <= 0 || c.StallProbeInterval > overload.MaxStallProbeInterval {
		bad("StallProbeInterval (%s) %v is outside (0, %v]", api.EnvStallProbeMs, c.StallProbeInterval, overload.MaxStallProbeInterval)
	}
	if c.StallAfter < 0 || c.StallAfter > overload.MaxStallProbeInterval {
		bad("StallAfter (%s) %v is outside [0, %v]", api.EnvStallAfterMs, c.StallAfter, overload.MaxStallProbeInterval)
	}
	return errors.Join(errs...)
}

func (c Config) guard() overload.Config {
	return overload.Config{MaxInFlight: c.MaxInFlight, StallProbeInterval: c.StallProbeInterval, StallAfter: c.StallAfter, Now: c.Now}
}

func (c Config) pool() pgpool.Config {
	return pgpool.Config{DSN: c.DatabaseURL, CloudSQLInstance: c.CloudSQLInstance, MaxConns: c.MaxConns}
}

// LoadConfig returns DefaultConfig overridden by the variables of EnvNames
// (PAYDB_URL, PAYDB_INSTANCE, PAYDB_MAX_CONNS, PAYMENT_FENCING_ENABLED,
// OUTBOX_POLL_MS, LOCK_PROOF_KEYS, RAIL_RECEIPT_KEYS, PAYMENT_TERMS_SIGNING_KEY, PAYMENT_MAX_IN_FLIGHT,
// PAYMENT_STALL_PROBE_MS, PAYMENT_STALL_AFTER_MS), read through getenv (os.Getenv in production; an unset
// or empty variable keeps the default), then validated. It reports every
// unparsable variable and every invalid field at once, joined; each error
// wraps ErrInvalidConfig and names the variable to fix.
func LoadConfig(getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	c.DatabaseURL = strings.TrimSpace(getenv(api.EnvDatabaseURL))
	c.CloudSQLInstance = strings.TrimSpace(getenv(api.EnvCloudSQLInstance))
	var errs []error
	if v := strings.TrimSpace(getenv(api.EnvMaxConns)); v != "" {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 0 {
			errs = append(errs, fmt.Errorf("%w: %s=%q: want a non-negative integer", ErrInvalidConfig, api.EnvMaxConns, v))
		} else {
			c.MaxConns = int32(n)
		}
	}
	on, err := fencing.Switch(api.EnvFencingEnabled, getenv(api.EnvFencingEnabled))
	if err != nil {
		errs = append(errs, fmt.Errorf("%w: %v", ErrInvalidConfig, err))
	}
	c.FencingDisabled = !on
	if v := strings.TrimSpace(getenv(api.EnvOutboxPollMs)); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms <= 0 || ms > int64(MaxOutboxPoll/time.Millisecond) {
			errs = append(errs, fmt.Errorf("%w: %s=%q: want milliseconds, %d..%d", ErrInvalidConfig, api.EnvOutboxPollMs, v,
				MinOutboxPoll.Milliseconds(), MaxOutboxPoll.Milliseconds()))
		} else {
			c.OutboxPoll = time.Duration(ms) * time.Millisecond
		}
	}
	for _, err := range (overload.Env{MaxInFlight: api.EnvMaxInFlight, StallProbeMs: api.EnvStallProbeMs, StallAfterMs: api.EnvStallAfterMs}).
		Load(getenv, &c.MaxInFlight, &c.StallProbeInterval, &c.StallAfter) {
		errs = append(errs, fmt.Errorf("%w: %v", ErrInvalidConfig, err))
	}
	for _, k := range []struct {
		name string
		dst  *fenceproof.Keyring
	}{{api.EnvProofKeys, &c.ProofKeys}, {api.EnvReceiptKeys, &c.ReceiptKeys}} {
		if v := strings.TrimSpace(getenv(k.name)); v != "" {
			ring, err := fencing.ParseKeys(k.name, v)
			if err != nil {
				errs = append(errs, fmt.Errorf("%w: %v", ErrInvalidConfig, err))
			}
			*k.dst = ring
		}
	}
	if v := strings.TrimSpace(getenv(api.EnvTermsSigningKey)); v != "" {
		if c.TermsKey, err = fenceproof.ParseSigningKey(v); err != nil {
			// A secret: the error names the key id at most.
			errs = append(errs, fmt.Errorf("%w: %s: %v", ErrInvalidConfig, api.EnvTermsSigningKey, err))
		}
	}
	if err := errors.Join(append(errs, c.Validate())...); err != nil {
		return Config{}, err
	}
	return c, nil
}
