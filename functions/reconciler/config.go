package reconciler

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutaudit"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/envcheck"
	lockapi "github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
)

// Environment variables of the reconciler's configuration, read by
// LoadConfig (LOCK_SERVER_URL is lockserver/api's EnvServerURL;
// PAYMENT_RESOURCE_URL and RAIL_PROXY_URL are the executor's names) and
// listed in docs/configuration.md. An unset or empty variable keeps the
// default.
const (
	// EnvPaymentResourceURL is payment-resource's base URL. Required.
	EnvPaymentResourceURL = "PAYMENT_RESOURCE_URL"
	// EnvRailProxyURL is rail-proxy's base URL. Required.
	EnvRailProxyURL = "RAIL_PROXY_URL"
	// EnvOwner is the reconciler's owner id at lock-server (default: the
	// SDK's, from the host name and a random suffix).
	EnvOwner = "RECONCILER_ID"
	// EnvLeaseTTLMs is the TTL of each payout's lease, in milliseconds.
	EnvLeaseTTLMs = "RECONCILER_LEASE_TTL_MS"
	// EnvAcquireWaitMs bounds the wait for a payout's lease, in
	// milliseconds; a lock held longer (an executor at work) is skipped
	// until the next pass.
	EnvAcquireWaitMs = "RECONCILER_ACQUIRE_WAIT_MS"
	// EnvRequestTimeoutMs bounds each call to payment-resource and
	// rail-proxy, in milliseconds.
	EnvRequestTimeoutMs = "RECONCILER_REQUEST_TIMEOUT_MS"
	// EnvPageSize is how many payouts of one state a pass reads per page.
	EnvPageSize = "RECONCILER_PAGE_SIZE"
	// EnvIntervalMs, when positive, runs a pass every that many
	// milliseconds in the process (the local stack); 0 (the default) runs
	// passes only on POST PathRuns (Cloud Scheduler on Cloud Run).
	EnvIntervalMs = "RECONCILER_INTERVAL_MS"
	// EnvAuditSettleMs is the wait, in milliseconds, between the audit's
	// two looks at a payout whose rail record is ahead of the books
	// (payoutaudit.Live); used only with the audit's variables.
	EnvAuditSettleMs = "RECONCILER_AUDIT_SETTLE_MS"
	// EnvIDTokens (true or false, default false), read by cmd/reconciler,
	// adds Cloud Run ID tokens to the calls to payment-resource and
	// rail-proxy.
	EnvIDTokens = "RECONCILER_ID_TOKENS"
)

// Config configures a Reconciler. Start from DefaultConfig or LoadConfig.
type Config struct {
	// LockServerURL, PaymentResourceURL and RailProxyURL are the base URLs
	// of the three services (absolute http(s)). Required.
	LockServerURL, PaymentResourceURL, RailProxyURL string
	// Owner is the owner id of the reconciler's leases; "" keeps the SDK's
	// default.
	Owner string
	// LeaseTTL is the TTL asked for each payout's lease (default 30s). It
	// must cover a reconciliation at rail-proxy (one rail look-up, at most
	// rail-proxy's RailTimeout) and a resolution; the lease is renewed in
	// the background meanwhile.
	LeaseTTL time.Duration
	// AcquireWait bounds the wait for a payout's lease (default 2s): a
	// lock held longer belongs to a worker at work on the account, and
	// the payout is left to the next pass.
	AcquireWait time.Duration
	// RequestTimeout bounds each call to payment-resource and rail-proxy
	// (default 15s; above rail-proxy's RailTimeout).
	RequestTimeout time.Duration
	// PageSize is the page size of the listing (default 100, at most
	// api.MaxListLimit).
	PageSize int
	// Interval, when positive, is the period of Loop (the local stack).
	// Default 0: no loop, passes only when triggered.
	Interval time.Duration
	// AuditSettle is the audit's wait before its second look at the
	// payouts whose rail record was ahead of the books (default
	// payoutaudit.DefaultSettle, 2s): a payout the rail paid that is
	// still not posted after it is reported. Read by cmd/reconciler for
	// DBAuditor; longer holds the pass longer (only when something was
	// flagged), shorter risks reporting a slow payout in flight.
	AuditSettle time.Duration
}

// ErrInvalidConfig: a Config field is out of bounds or a variable does not
// parse.
var ErrInvalidConfig = errors.New("reconciler: invalid config")

// DefaultConfig returns the defaults documented on Config (URLs empty).
func DefaultConfig() Config {
	return Config{LeaseTTL: 30 * time.Second, AcquireWait: 2 * time.Second, RequestTimeout: 15 * time.Second, PageSize: 100,
		AuditSettle: payoutaudit.DefaultSettle}
}

// EnvNames returns the variables LoadConfig reads, for envcheck.
func EnvNames() []string {
	return []string{lockapi.EnvServerURL, EnvPaymentResourceURL, EnvRailProxyURL, EnvOwner, EnvLeaseTTLMs,
		EnvAcquireWaitMs, EnvRequestTimeoutMs, EnvPageSize, EnvIntervalMs, EnvAuditSettleMs}
}

// LoadConfig returns DefaultConfig overridden by the variables of
// EnvNames, read through getenv, then validated. Every error is reported
// at once, joined; each wraps ErrInvalidConfig and names the variable.
func LoadConfig(getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	c.LockServerURL = strings.TrimSpace(getenv(lockapi.EnvServerURL))
	c.PaymentResourceURL = strings.TrimSpace(getenv(EnvPaymentResourceURL))
	c.RailProxyURL = strings.TrimSpace(getenv(EnvRailProxyURL))
	c.Owner = strings.TrimSpace(getenv(EnvOwner))
	var errs []error
	for _, d := range []struct {
		key    string
		dst    *time.Duration
		zeroOK bool
	}{
		{key: EnvLeaseTTLMs, dst: &c.LeaseTTL}, {key: EnvAcquireWaitMs, dst: &c.AcquireWait},
		{key: EnvRequestTimeoutMs, dst: &c.RequestTimeout}, {key: EnvIntervalMs, dst: &c.Interval, zeroOK: true},
		{key: EnvAuditSettleMs, dst: &c.AuditSettle},
	} {
		v := strings.TrimSpace(getenv(d.key))
		if v == "" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || (n == 0 && !d.zeroOK) || n > int64(time.Hour/time.Millisecond) {
			errs = append(errs, fmt.Errorf("%w: %s=%q: want milliseconds in [1, 3600000]", ErrInvalidConfig, d.key, v))
			continue
		}
		*d.dst = time.Duration(n) * time.Millisecond
	}
	if v := strings.TrimSpace(getenv(EnvPageSize)); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: %s=%q: want a whole number", ErrInvalidConfig, EnvPageSize, v))
		} else {
			c.PageSize = n
		}
	}
	if err := errors.Join(append(errs, c.Validate())...); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Validate returns nil or one error per invalid field, joined, each
// wrapping ErrInvalidConfig and naming the field's variable.
func (c Config) Validate() error {
	var errs []error
	for _, u := range []struct{ name, v string }{
		{lockapi.EnvServerURL, c.LockServerURL}, {EnvPaymentResourceURL, c.PaymentResourceURL}, {EnvRailProxyURL, c.RailProxyURL},
	} {
		if err := envcheck.HTTPURL(u.name, u.v); err != nil {
			errs = append(errs, fmt.Errorf("%w: %v", ErrInvalidConfig, err))
		}
	}
	if c.LeaseTTL <= 0 {
		errs = append(errs, fmt.Errorf("%w: LeaseTTL (%s) %v must be positive", ErrInvalidConfig, EnvLeaseTTLMs, c.LeaseTTL))
	}
	if c.AcquireWait <= 0 {
		errs = append(errs, fmt.Errorf("%w: AcquireWait (%s) %v must be positive", ErrInvalidConfig, EnvAcquireWaitMs, c.AcquireWait))
	}
	if c.RequestTimeout <= 0 {
		errs = append(errs, fmt.Errorf("%w: RequestTimeout (%s) %v must be positive", ErrInvalidConfig, EnvRequestTimeoutMs, c.RequestTimeout))
	}
	if c.PageSize < 1 || c.PageSize > api.MaxListLimit {
		errs = append(errs, fmt.Errorf("%w: PageSize (%s) %d must be in 1..%d", ErrInvalidConfig, EnvPageSize, c.PageSize, api.MaxListLimit))
	}
	if c.AuditSettle <= 0 {
		errs = append(errs, fmt.Errorf("%w: AuditSettle (%s) %v must be positive", ErrInvalidConfig, EnvAuditSettleMs, c.AuditSettle))
	}
	if c.Interval < 0 {
		errs = append(errs, fmt.Errorf("%w: Interval (%s) %v must not be negative", ErrInvalidConfig, EnvIntervalMs, c.Interval))
	}
	return errors.Join(errs...)
}
