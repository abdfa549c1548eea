package executor

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
)

// Config configures an Executor. Every field has an environment variable,
// read by LoadConfig and listed in docs/configuration.md.
type Config struct {
	// LockServerURL is lock-server's base URL (LOCK_SERVER_URL). Required.
	LockServerURL string
	// PaymentResourceURL is payment-resource's base URL (PAYMENT_RESOURCE_URL). Required.
	PaymentResourceURL string
	// RailProxyURL is rail-proxy's base URL (RAIL_PROXY_URL). Required.
	RailProxyURL string
	// Owner is this worker's owner id in leases and logs (EXECUTOR_ID).
	// Default: the SDK's host-pid-random id.
	Owner string
	// LeaseTTL is the TTL of the payout lease (LEASE_TTL_MS, default 10000).
	// It must cover one claim, one rail submission and one result post with
	// room to spare; the lease is renewed in the background meanwhile.
	LeaseTTL time.Duration
	// AcquireWait bounds how long one delivery waits for the account's lock
	// before answering 503 so that Pub/Sub redelivers later
	// (ACQUIRE_WAIT_MS, default 15000).
	AcquireWait time.Duration
	// RequestTimeout bounds each call to payment-resource
	// (EXECUTOR_REQUEST_TIMEOUT_MS, default 5000).
	RequestTimeout time.Duration
	// RailTimeout bounds the call to rail-proxy, which waits for the rail
	// (RAIL_CALL_TIMEOUT_MS, default 10000). Past it the outcome is unknown.
	RailTimeout time.Duration
}

// DefaultConfig returns the defaults documented on Config, without URLs.
func DefaultConfig() Config {
	return Config{
		LeaseTTL:       10 * time.Second,
		AcquireWait:    15 * time.Second,
		RequestTimeout: 5 * time.Second,
		RailTimeout:    10 * time.Second,
	}
}

// LoadConfig reads the environment through getenv and validates the result.
func LoadConfig(getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	c.LockServerURL = getenv("LOCK_SERVER_URL")
	c.PaymentResourceURL = getenv("PAYMENT_RESOURCE_URL")
	c.RailProxyURL = getenv("RAIL_PROXY_URL")
	c.Owner = getenv("EXECUTOR_ID")
	var errs []error
	for _, d := range []struct {
		key string
		dst *time.Duration
	}{
		{"LEASE_TTL_MS", &c.LeaseTTL}, {"ACQUIRE_WAIT_MS", &c.AcquireWait},
		{"EXECUTOR_REQUEST_TIMEOUT_MS", &c.RequestTimeout}, {"RAIL_CALL_TIMEOUT_MS", &c.RailTimeout},
	} {
		if v := getenv(d.key); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n <= 0 {
				errs = append(errs, fmt.Errorf("%s=%q: want a positive number of milliseconds", d.key, v))
				continue
			}
			*d.dst = time.Duration(n) * time.Millisecond
		}
	}
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// Validate returns an error naming every missing or inconsistent field.
func (c Config) Validate() error {
	var errs []error
	for name, u := range map[string]string{"LOCK_SERVER_URL": c.LockServerURL, "PAYMENT_RESOURCE_URL": c.PaymentResourceURL, "RAIL_PROXY_URL": c.RailProxyURL} {
		p, err := url.Parse(u)
		if u == "" || err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			errs = append(errs, fmt.Errorf("%s=%q: want an absolute http(s) URL", name, u))
		}
	}
	if c.Owner != "" {
		if err := api.ValidateOwner(c.Owner); err != nil {
			errs = append(errs, fmt.Errorf("EXECUTOR_ID: %v", err))
		}
	}
	if err := api.ValidateTTLMs(c.LeaseTTL.Milliseconds()); err != nil || c.LeaseTTL%time.Millisecond != 0 {
		errs = append(errs, fmt.Errorf("LEASE_TTL_MS: %v", err))
	}
	for name, d := range map[string]time.Duration{"ACQUIRE_WAIT_MS": c.AcquireWait, "EXECUTOR_REQUEST_TIMEOUT_MS": c.RequestTimeout, "RAIL_CALL_TIMEOUT_MS": c.RailTimeout} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive", name))
		}
	}
	return errors.Join(errs...)
}
