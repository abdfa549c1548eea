package main

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/etcdstore"
)

// config is lock-server's whole configuration, read from the environment.
// Every key is listed, with its default, in docs/configuration.md.
type config struct {
	// Store selects the backend: "postgres" or "etcd" (LOCK_STORE).
	Store string
	// Addr is the HTTP listen address (LOCK_HTTP_ADDR; else ":" + PORT, the
	// container platforms' convention; else "127.0.0.1:8080": the API has no
	// authentication, so it listens on loopback unless told otherwise).
	Addr string
	// LockDBURL is the PostgreSQL DSN of lockdb (LOCKDB_URL), for Store=postgres.
	LockDBURL string
	// LockDBMaxConns caps the pool (LOCKDB_MAX_CONNS, default 16).
	LockDBMaxConns int32
	// EtcdEndpoints are the etcd client URLs (ETCD_ENDPOINTS, comma-separated),
	// for Store=etcd.
	EtcdEndpoints []string
	// EtcdPrefix is the key prefix of lock keys in etcd (ETCD_PREFIX, default
	// "/dlock/locks/").
	EtcdPrefix string
	// EtcdIdleLeases caps the idle etcd leases, granted ahead of time and
	// each used for at most one grant, that etcdstore keeps so acquires
	// need not wait for a lease grant (ETCD_IDLE_LEASES, default 64; 0
	// turns the pool off). See etcdstore's package doc.
	EtcdIdleLeases int
	// RequestTimeout bounds each backend call (LOCK_REQUEST_TIMEOUT_MS, default 5000).
	RequestTimeout time.Duration
	// ShutdownTimeout bounds the drain of in-flight requests on SIGTERM
	// (LOCK_SHUTDOWN_TIMEOUT_MS, default 10000).
	ShutdownTimeout time.Duration
	// LogLevel is debug, info, warn or error (LOG_LEVEL, default info).
	LogLevel slog.Level
}

const (
	// maxTimeoutMs caps the timeout settings (one hour): longer is a typo.
	maxTimeoutMs = 3_600_000
	// maxIdleLeases caps ETCD_IDLE_LEASES: more idle leases than this per
	// lock-server only burden etcd's lessor.
	maxIdleLeases = 100_000
)

// loadConfig reads the configuration through getenv and validates it.
func loadConfig(getenv func(string) string) (config, error) {
	c := config{
		Store:           strings.TrimSpace(getenv("LOCK_STORE")),
		Addr:            getenv("LOCK_HTTP_ADDR"),
		LockDBURL:       getenv("LOCKDB_URL"),
		LockDBMaxConns:  16,
		EtcdPrefix:      "/dlock/locks/",
		EtcdIdleLeases:  etcdstore.DefaultIdleLeases,
		RequestTimeout:  5 * time.Second,
		ShutdownTimeout: 10 * time.Second,
	}
	var errs []error
	if c.Store == "" {
		c.Store = "postgres"
	}
	if c.Addr == "" {
		c.Addr = "127.0.0.1:8080"
		if p := getenv("PORT"); p != "" {
			if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != p {
				errs = append(errs, fmt.Errorf("PORT=%q: want a TCP port number, 1..65535", p))
			}
			c.Addr = ":" + p
		}
	}
	if v := getenv("ETCD_ENDPOINTS"); v != "" {
		for _, e := range strings.Split(v, ",") {
			if e = strings.TrimSpace(e); e != "" {
				c.EtcdEndpoints = append(c.EtcdEndpoints, e)
			}
		}
	}
	if v := getenv("ETCD_PREFIX"); v != "" {
		if !strings.HasPrefix(v, "/") || !strings.HasSuffix(v, "/") {
			errs = append(errs, fmt.Errorf("ETCD_PREFIX=%q: want a key prefix that starts and ends with /", v))
		}
		c.EtcdPrefix = v
	}
	if v := getenv("ETCD_IDLE_LEASES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxIdleLeases {
			errs = append(errs, fmt.Errorf("ETCD_IDLE_LEASES=%q: want an integer between 0 (no pool) and %d", v, maxIdleLeases))
		}
		c.EtcdIdleLeases = n
	}
	if v := getenv("LOCKDB_MAX_CONNS"); v != "" {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 1 {
			errs = append(errs, fmt.Errorf("LOCKDB_MAX_CONNS=%q: want a positive integer", v))
		}
		c.LockDBMaxConns = int32(n)
	}
	for _, d := range []struct {
		key string
		dst *time.Duration
	}{{"LOCK_REQUEST_TIMEOUT_MS", &c.RequestTimeout}, {"LOCK_SHUTDOWN_TIMEOUT_MS", &c.ShutdownTimeout}} {
		if v := getenv(d.key); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 1 || n > maxTimeoutMs {
				errs = append(errs, fmt.Errorf("%s=%q: want a number of milliseconds between 1 and %d", d.key, v, maxTimeoutMs))
			}
			*d.dst = time.Duration(n) * time.Millisecond
		}
	}
	if v := getenv("LOG_LEVEL"); v != "" {
		if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil || strings.ContainsAny(v, "+-") {
			errs = append(errs, fmt.Errorf("LOG_LEVEL=%q: want debug, info, warn or error", v))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	return c, c.Validate()
}

// Validate returns an error naming every missing or contradictory setting.
func (c config) Validate() error {
	var errs []error
	switch c.Store {
	case "postgres":
		if c.LockDBURL == "" {
			errs = append(errs, errors.New("LOCK_STORE=postgres needs LOCKDB_URL (a PostgreSQL DSN)"))
		}
	case "etcd":
		if len(c.EtcdEndpoints) == 0 {
			errs = append(errs, errors.New("LOCK_STORE=etcd needs ETCD_ENDPOINTS (comma-separated client URLs)"))
		}
	default:
		errs = append(errs, fmt.Errorf("LOCK_STORE=%q: want postgres or etcd", c.Store))
	}
	if c.Addr == "" {
		errs = append(errs, errors.New("LOCK_HTTP_ADDR is empty"))
	}
	return errors.Join(errs...)
}
