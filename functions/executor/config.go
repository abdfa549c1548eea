package executor

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/envcheck"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
)

// Environment variables of the executor's configuration, read by
// LoadConfig (LOCK_SERVER_URL is lockserver/api's EnvServerURL) and listed
// in docs/configuration.md. An unset or empty variable keeps the default.
const (
	// EnvPaymentResourceURL is payment-resource's base URL.
	EnvPaymentResourceURL = "PAYMENT_RESOURCE_URL"
	// EnvRailProxyURL is rail-proxy's base URL.
	EnvRailProxyURL = "RAIL_PROXY_URL"
	// EnvOwner is this worker's owner id.
	EnvOwner = "EXECUTOR_ID"
	// EnvLeaseTTLMs is the payout lease's TTL in milliseconds.
	EnvLeaseTTLMs = "LEASE_TTL_MS"
	// EnvAcquireWaitMs bounds the wait for the account's lock, in
	// milliseconds.
	EnvAcquireWaitMs = "ACQUIRE_WAIT_MS"
	// EnvRequestTimeoutMs bounds each call to payment-resource, in
	// milliseconds.
	EnvRequestTimeoutMs = "EXECUTOR_REQUEST_TIMEOUT_MS"
	// EnvRailTimeoutMs bounds the call to rail-proxy, in milliseconds.
	EnvRailTimeoutMs = "RAIL_CALL_TIMEOUT_MS"
	// EnvReportAttempts is how many times one delivery sends a report to
	// payment-resource (a result, a needs_attention mark) while the
	// answers are transient (RetryConfig.Attempts).
	EnvReportAttempts = "EXECUTOR_REPORT_ATTEMPTS"
	// EnvReportBackoffMs is the wait before the first repeat, in
	// milliseconds (RetryConfig.Initial).
	EnvReportBackoffMs = "EXECUTOR_REPORT_BACKOFF_MS"
	// EnvReportBackoffMaxMs caps every wait, in milliseconds
	// (RetryConfig.Max).
	EnvReportBackoffMaxMs = "EXECUTOR_REPORT_BACKOFF_MAX_MS"
)

// queueWait is how long each acquire request of the executor waits in
// lock-server's queue of the key (client.WithWait): AcquireWait in whole
// milliseconds, at most api.MaxWaitMs; 0 (no queue: the SDK's retries
// with backoff) when that is below api.MinWaitMs.
func queueWait(acquireWait time.Duration) time.Duration {
	d := min(acquireWait.Truncate(time.Millisecond), api.MaxWaitMs*time.Millisecond)
	if d < api.MinWaitMs*time.Millisecond {
		return 0
	}
	return d
}

// ErrInvalidConfig is wrapped by every error of Validate and LoadConfig.
var ErrInvalidConfig = errors.New("executor: invalid config")

// Config configures an Executor. Start from DefaultConfig (or LoadConfig);
// every field has an environment variable, listed in
// docs/configuration.md.
type Config struct {
	// LockServerURL is lock-server's base URL (LOCK_SERVER_URL). Required.
	LockServerURL string
	// PaymentResourceURL is payment-resource's base URL (PAYMENT_RESOURCE_URL). Required.
	PaymentResourceURL string
	// RailProxyURL is rail-proxy's base URL (RAIL_PROXY_URL). Required.
	RailProxyURL string
	// Owner is this worker's owner id in leases and logs (EXECUTOR_ID).
	// Default "": the SDK's host-pid-random id.
	Owner string
	// LeaseTTL is the TTL of the payout lease (LEASE_TTL_MS, default 10000,
	// within lockserver/api's MinTTLMs..MaxTTLMs, whole milliseconds).
	// It must cover one claim, one rail submission and one result post with
	// room to spare; the lease is renewed in the background meanwhile.
	// The claim is preceded by a check of the lease's local deadline
	// only, the rail submission by a confirmation with lock-server.
	LeaseTTL time.Duration
	// AcquireWait bounds how long one delivery waits for the account's lock
	// before answering 503 so that Pub/Sub redelivers later
	// (ACQUIRE_WAIT_MS, default 15000, positive). The wait is spent in
	// lock-server's queue of the key (api.AcquireRequest.WaitMs, at most
	// api.MaxWaitMs per request), so that the lock passes from one
	// delivery to the next about one round trip after the release; below
	// api.MinWaitMs the SDK retries with backoff instead.
	AcquireWait time.Duration
	// RequestTimeout bounds each call to payment-resource
	// (EXECUTOR_REQUEST_TIMEOUT_MS, default 5000, positive).
	RequestTimeout time.Duration
	// RailTimeout bounds the call to rail-proxy, which waits for the rail
	// (RAIL_CALL_TIMEOUT_MS, default 10000, positive). Past it the outcome
	// is unknown.
	RailTimeout time.Duration
	// ReportRetry is the in-process retry of the reports to
	// payment-resource after the rail has answered (the result, and a
	// needs_attention mark), which are idempotent: the money has moved or
	// not, and recording it now is cheaper than a redelivery that takes a
	// new lease. Only answers Classify calls transient are retried; when
	// the attempts run out the delivery is redelivered by Pub/Sub.
	ReportRetry RetryConfig
}

// RetryConfig is an exponential backoff with jitter: the wait before
// repeat n (n = 1, 2, ...) is drawn uniformly from [d/2, d] with
// d = min(Max, Initial * 2^(n-1)) ("equal jitter": never less than half
// the exponential step, so that the backoff still grows, and spread so
// that executors that failed together do not retry together).
type RetryConfig struct {
	// Attempts is how many times a report is sent at most, the first
	// included (EXECUTOR_REPORT_ATTEMPTS, default 4, 1..10). 1 sends once
	// and leaves every retry to Pub/Sub.
	Attempts int
	// Initial is the step before the first repeat
	// (EXECUTOR_REPORT_BACKOFF_MS, default 200 ms, positive).
	Initial time.Duration
	// Max caps every step (EXECUTOR_REPORT_BACKOFF_MAX_MS, default 2000
	// ms, at least Initial). The defaults wait at most 200 + 400 + 800 ms
	// in all, well inside the ack deadline of a push (120 s, the
	// subscription's in terraform/main.tf and payoutbus.DefaultPushTimeout).
	Max time.Duration
}

// DefaultRetryConfig returns the defaults documented on RetryConfig.
func DefaultRetryConfig() RetryConfig {
	return RetryConfig{Attempts: 4, Initial: 200 * time.Millisecond, Max: 2 * time.Second}
}

// Delay returns the wait before repeat n (1 for the first repeat), drawn
// from r as RetryConfig describes. r must not be used concurrently.
func (c RetryConfig) Delay(n int, r *rand.Rand) time.Duration {
	d := c.Max
	if n < 1 {
		n = 1
	}
	if n <= 32 {
		if step := c.Initial << (n - 1); step > 0 && step < c.Max {
			d = step
		}
	}
	half := d / 2
	return half + time.Duration(r.Int64N(int64(d-half)+1))
}

// validate reports every invalid field of c, each naming its variable.
func (c RetryConfig) validate() []error {
	var errs []error
	if c.Attempts < 1 || c.Attempts > 10 {
		errs = append(errs, fmt.Errorf("%w: %s is %d; want 1..10", ErrInvalidConfig, EnvReportAttempts, c.Attempts))
	}
	if c.Initial <= 0 {
		errs = append(errs, fmt.Errorf("%w: %s must be positive", ErrInvalidConfig, EnvReportBackoffMs))
	}
	if c.Max < c.Initial {
		errs = append(errs, fmt.Errorf("%w: %s (%v) is less than %s (%v)", ErrInvalidConfig, EnvReportBackoffMaxMs, c.Max, EnvReportBackoffMs, c.Initial))
	}
	return errs
}

// DefaultConfig returns the defaults documented on Config, without URLs.
func DefaultConfig() Config {
	return Config{
		LeaseTTL:       10 * time.Second,
		AcquireWait:    15 * time.Second,
		RequestTimeout: 5 * time.Second,
		RailTimeout:    10 * time.Second,
		ReportRetry:    DefaultRetryConfig(),
	}
}

// EnvNames returns the environment variables LoadConfig reads, for
// envcheck (cmd/executor adds those of package fault).
func EnvNames() []string {
	return []string{api.EnvServerURL, EnvPaymentResourceURL, EnvRailProxyURL, EnvOwner,
		EnvLeaseTTLMs, EnvAcquireWaitMs, EnvRequestTimeoutMs, EnvRailTimeoutMs,
		EnvReportAttempts, EnvReportBackoffMs, EnvReportBackoffMaxMs}
}

// LoadConfig returns DefaultConfig overridden by the variables of EnvNames,
// read through getenv (an empty value keeps the default), then validated.
// It reports every unparsable variable and every invalid field at once,
// joined; each error wraps ErrInvalidConfig and names the variable to fix.
func LoadConfig(getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	c.LockServerURL = strings.TrimSpace(getenv(api.EnvServerURL))
	c.PaymentResourceURL = strings.TrimSpace(getenv(EnvPaymentResourceURL))
	c.RailProxyURL = strings.TrimSpace(getenv(EnvRailProxyURL))
	c.Owner = getenv(EnvOwner)
	var errs []error
	for _, d := range []struct {
		key string
		dst *time.Duration
	}{
		{EnvLeaseTTLMs, &c.LeaseTTL}, {EnvAcquireWaitMs, &c.AcquireWait},
		{EnvRequestTimeoutMs, &c.RequestTimeout}, {EnvRailTimeoutMs, &c.RailTimeout},
		{EnvReportBackoffMs, &c.ReportRetry.Initial}, {EnvReportBackoffMaxMs, &c.ReportRetry.Max},
	} {
		if v := strings.TrimSpace(getenv(d.key)); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n <= 0 {
				errs = append(errs, fmt.Errorf("%w: %s=%q: want a positive number of milliseconds", ErrInvalidConfig, d.key, v))
				continue
			}
			*d.dst = time.Duration(n) * time.Millisecond
		}
	}
	if v := strings.TrimSpace(getenv(EnvReportAttempts)); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: %s=%q: want a whole number of attempts", ErrInvalidConfig, EnvReportAttempts, v))
		} else {
			c.ReportRetry.Attempts = n
		}
	}
	if err := errors.Join(append(errs, c.Validate())...); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Validate returns nil or one error per missing or invalid field, joined
// (errors.Join), each wrapping ErrInvalidConfig and naming the field's
// environment variable.
func (c Config) Validate() error {
	var errs []error
	for _, u := range []struct{ name, v string }{
		{api.EnvServerURL, c.LockServerURL}, {EnvPaymentResourceURL, c.PaymentResourceURL}, {EnvRailProxyURL, c.RailProxyURL},
	} {
		if err := envcheck.HTTPURL(u.name, u.v); err != nil {
			errs = append(errs, fmt.Errorf("%w: %v", ErrInvalidConfig, err))
		}
	}
	if c.Owner != "" {
		if err := api.ValidateOwner(c.Owner); err != nil {
			errs = append(errs, fmt.Errorf("%w: %s: %v", ErrInvalidConfig, EnvOwner, err))
		}
	}
	if err := api.ValidateTTLMs(c.LeaseTTL.Milliseconds()); err != nil {
		errs = append(errs, fmt.Errorf("%w: %s: %v", ErrInvalidConfig, EnvLeaseTTLMs, err))
	} else if c.LeaseTTL%time.Millisecond != 0 {
		errs = append(errs, fmt.Errorf("%w: %s: LeaseTTL %v is not whole milliseconds", ErrInvalidConfig, EnvLeaseTTLMs, c.LeaseTTL))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{EnvAcquireWaitMs, c.AcquireWait}, {EnvRequestTimeoutMs, c.RequestTimeout}, {EnvRailTimeoutMs, c.RailTimeout}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%w: %s must be positive", ErrInvalidConfig, d.name))
		}
	}
	errs = append(errs, c.ReportRetry.validate()...)
	return errors.Join(errs...)
}
