package main

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	lockcfg "github.com/distributed-lock-lab/distributed-lock-lab/lockserver/config"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/etcdstore"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/pgstore"
)

// errInvalidConfig is wrapped by every error of config.Validate and
// loadConfig (main prefixes the process name).
var errInvalidConfig = errors.New("invalid config")

// config is lock-server's whole configuration, read from the environment
// (the variable names are lockserver/config's Env constants; every one is
// listed, with its default, in docs/configuration.md). Start from
// defaultConfig: the zero value is not the defaults. The stores' settings
// are the stores' own Config types, so that each default (lockdb's pool
// size, etcd's idle leases) is written once, in its store's DefaultConfig.
type config struct {
	// Store selects the backend: "postgres" or "etcd" (LOCK_STORE,
	// default postgres).
	Store string
	// Addr is the HTTP listen address (LOCK_HTTP_ADDR; else ":" + PORT, the
	// container platforms' convention; else "127.0.0.1:8080": the API has no
	// authentication, so it listens on loopback unless told otherwise).
	Addr string
	// LockDB configures the postgres store: DSN from LOCKDB_URL (required
	// with Store=postgres; several hosts with target_session_attrs=read-write
	// follow a failover), MaxConns from LOCKDB_MAX_CONNS (default
	// pgstore.DefaultMaxConns), AcceptPromotion from LOCKDB_ACCEPT_PROMOTION
	// (default false); the rest are pgstore's defaults.
	LockDB pgstore.Config
	// Etcd configures the etcd store: Endpoints from ETCD_ENDPOINTS
	// (comma-separated, required with Store=etcd), Prefix from ETCD_PREFIX
	// (default etcdstore.DefaultPrefix), IdleLeases from ETCD_IDLE_LEASES
	// (default etcdstore.DefaultIdleLeases; 0 turns the pool off, the same
	// meaning in both places), RequestTimeout from RequestTimeout.
	Etcd etcdstore.Config
	// RequestTimeout bounds each backend call (LOCK_REQUEST_TIMEOUT_MS,
	// default 5000, at most maxTimeoutMs).
	RequestTimeout time.Duration
	// MaxInFlight bounds the lock requests served at once; more get 503
	// OVERLOADED at once (LOCK_MAX_IN_FLIGHT, default
	// lockserver.DefaultServerConfig's 256, 1..maxInFlight).
	MaxInFlight int
	// StallProbeTimeout bounds the request let through to probe a stalled
	// backend (LOCK_STALL_PROBE_TIMEOUT_MS, default
	// lockserver.DefaultStallProbeTimeout, 1000; 1..maxStallProbeTimeoutMs).
	// See lockserver.ServerConfig.StallProbeTimeout.
	StallProbeTimeout time.Duration
	// Batching turns group grant on (LOCK_BATCH_ENABLED, default true with
	// PostgreSQL and false with etcd: keys granted in one etcd transaction
	// share its revision, so two keys could carry the same token, and
	// INV-02 promises that no token is issued twice; per key the tokens
	// still strictly increase when it is turned on);
	// Batch.MaxSize is LOCK_BATCH_MAX and Batch.Window
	// LOCK_BATCH_WINDOW_US (defaults lockserver.DefaultBatchConfig's 64
	// and 0). See lockserver.Batcher.
	Batching bool
	Batch    lockserver.BatchConfig
	// Handoff lets a release hand its key to the parked head waiter in
	// one backend transaction (LOCK_HANDOFF_ENABLED, default true, with
	// either store). See lockserver.ServerConfig.Handoff.
	Handoff bool
	// ShutdownTimeout bounds the drain of in-flight requests on SIGTERM
	// (LOCK_SHUTDOWN_TIMEOUT_MS, default 10000, at most maxTimeoutMs).
	ShutdownTimeout time.Duration
	// LogLevel is debug, info, warn or error (LOG_LEVEL, default info).
	LogLevel slog.Level
	// ProofKey signs grant proofs (LOCK_PROOF_SIGNING_KEY, default none:
	// grants carry no proof, and fence points that verify tokens refuse
	// every holder). See lockserver/fenceproof.
	ProofKey fenceproof.SigningKey
}

const (
	// maxTimeoutMs caps the timeout settings (one hour): longer is a typo.
	maxTimeoutMs = 3_600_000
	// maxInFlight caps LOCK_MAX_IN_FLIGHT: more is a typo.
	maxInFlight = 100_000
	// maxIdleLeases caps ETCD_IDLE_LEASES: more idle leases than this per
	// lock-server only burden etcd's lessor.
	maxIdleLeases = 100_000
	// maxStallProbeTimeoutMs caps LOCK_STALL_PROBE_TIMEOUT_MS
	// (overload.MaxStallProbeInterval, one minute).
	maxStallProbeTimeoutMs = 60_000
)

// defaultConfig returns the defaults documented on config.
func defaultConfig() config {
	c := config{
		Store:             "postgres",
		Addr:              "127.0.0.1:8080",
		LockDB:            pgstore.DefaultConfig(),
		Etcd:              etcdstore.DefaultConfig(),
		RequestTimeout:    lockserver.DefaultServerConfig().RequestTimeout,
		ShutdownTimeout:   10 * time.Second,
		MaxInFlight:       lockserver.DefaultServerConfig().MaxInFlight,
		StallProbeTimeout: lockserver.DefaultServerConfig().StallProbeTimeout,
		Batching:          lockserver.DefaultServerConfig().Batching,
		Batch:             lockserver.DefaultServerConfig().Batch,
		Handoff:           lockserver.DefaultServerConfig().Handoff,
		LogLevel:          slog.LevelInfo,
	}
	c.Etcd.RequestTimeout = c.RequestTimeout
	return c
}

// envNames returns every environment variable loadConfig reads, for
// envcheck (logjson's platform detection reads K_SERVICE and
// KUBERNETES_SERVICE_HOST, which carry none of envcheck.Prefixes).
func envNames() []string {
	return []string{lockcfg.EnvStore, lockcfg.EnvHTTPAddr, lockcfg.EnvPort, lockcfg.EnvLockDBURL, lockcfg.EnvLockDBMaxConns,
		lockcfg.EnvLockDBAcceptPromotion,
		lockcfg.EnvEtcdEndpoints, lockcfg.EnvEtcdPrefix, lockcfg.EnvEtcdIdleLeases, lockcfg.EnvRequestTimeoutMs,
		lockcfg.EnvShutdownTimeoutMs, lockcfg.EnvLogLevel, lockcfg.EnvProofSigningKey, lockcfg.EnvMaxInFlight,
		lockcfg.EnvStallProbeTimeoutMs, lockcfg.EnvBatchEnabled, lockcfg.EnvBatchMax, lockcfg.EnvBatchWindowUs,
		lockcfg.EnvHandoffEnabled}
}

// loadConfig returns defaultConfig overridden by the variables of envNames,
// read through getenv (an empty value keeps the default), then validated.
// It reports every unparsable variable and every invalid setting at once,
// joined; each error wraps errInvalidConfig and names the variable to fix.
func loadConfig(getenv func(string) string) (config, error) {
	c := defaultConfig()
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{errInvalidConfig}, a...)...))
	}
	if v := strings.TrimSpace(getenv(lockcfg.EnvStore)); v != "" {
		c.Store = v
	}
	if v := getenv(lockcfg.EnvHTTPAddr); v != "" {
		c.Addr = v
	} else if p := getenv(lockcfg.EnvPort); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != p {
			bad("%s=%q: want a TCP port number, 1..65535", lockcfg.EnvPort, p)
		}
		c.Addr = ":" + p
	}
	c.LockDB.DSN = getenv(lockcfg.EnvLockDBURL)
	if v := getenv(lockcfg.EnvEtcdEndpoints); v != "" {
		for _, e := range strings.Split(v, ",") {
			if e = strings.TrimSpace(e); e != "" {
				c.Etcd.Endpoints = append(c.Etcd.Endpoints, e)
			}
		}
	}
	if v := getenv(lockcfg.EnvEtcdPrefix); v != "" {
		c.Etcd.Prefix = v
	}
	if v := getenv(lockcfg.EnvEtcdIdleLeases); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxIdleLeases {
			bad("%s=%q: want an integer between 0 (no pool) and %d", lockcfg.EnvEtcdIdleLeases, v, maxIdleLeases)
		} else {
			c.Etcd.IdleLeases = n
		}
	}
	if v := getenv(lockcfg.EnvLockDBMaxConns); v != "" {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 1 {
			bad("%s=%q: want a positive integer", lockcfg.EnvLockDBMaxConns, v)
		} else {
			c.LockDB.MaxConns = int32(n)
		}
	}
	if v := strings.TrimSpace(getenv(lockcfg.EnvLockDBAcceptPromotion)); v != "" {
		switch v {
		case "true":
			c.LockDB.AcceptPromotion = true
		case "false":
			c.LockDB.AcceptPromotion = false
		default:
			bad("%s=%q: want true or false", lockcfg.EnvLockDBAcceptPromotion, v)
		}
	}
	for _, d := range []struct {
		key string
		dst *time.Duration
	}{{lockcfg.EnvRequestTimeoutMs, &c.RequestTimeout}, {lockcfg.EnvShutdownTimeoutMs, &c.ShutdownTimeout}} {
		if v := getenv(d.key); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 1 || n > maxTimeoutMs {
				bad("%s=%q: want a number of milliseconds between 1 and %d", d.key, v, maxTimeoutMs)
			} else {
				*d.dst = time.Duration(n) * time.Millisecond
			}
		}
	}
	c.Etcd.RequestTimeout = c.RequestTimeout
	if v := strings.TrimSpace(getenv(lockcfg.EnvMaxInFlight)); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxInFlight {
			bad("%s=%q: want an integer between 1 and %d", lockcfg.EnvMaxInFlight, v, maxInFlight)
		} else {
			c.MaxInFlight = n
		}
	}
	if v := strings.TrimSpace(getenv(lockcfg.EnvStallProbeTimeoutMs)); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 || n > maxStallProbeTimeoutMs {
			bad("%s=%q: want a number of milliseconds between 1 and %d", lockcfg.EnvStallProbeTimeoutMs, v, maxStallProbeTimeoutMs)
		} else {
			c.StallProbeTimeout = time.Duration(n) * time.Millisecond
		}
	}
	if c.Store == "etcd" {
		c.Batching = false
	}
	if v := strings.TrimSpace(getenv(lockcfg.EnvBatchEnabled)); v != "" {
		switch v {
		case "true":
			c.Batching = true
		case "false":
			c.Batching = false
		default:
			bad("%s=%q: want true or false", lockcfg.EnvBatchEnabled, v)
		}
	}
	if v := strings.TrimSpace(getenv(lockcfg.EnvHandoffEnabled)); v != "" {
		switch v {
		case "true":
			c.Handoff = true
		case "false":
			c.Handoff = false
		default:
			bad("%s=%q: want true or false", lockcfg.EnvHandoffEnabled, v)
		}
	}
	if v := strings.TrimSpace(getenv(lockcfg.EnvBatchMax)); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > lockserver.MaxBatchMaxSize {
			bad("%s=%q: want an integer between 1 and %d", lockcfg.EnvBatchMax, v, lockserver.MaxBatchMaxSize)
		} else {
			c.Batch.MaxSize = n
		}
	}
	if v := strings.TrimSpace(getenv(lockcfg.EnvBatchWindowUs)); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > lockserver.MaxBatchWindow.Microseconds() {
			bad("%s=%q: want microseconds between 0 and %d", lockcfg.EnvBatchWindowUs, v, lockserver.MaxBatchWindow.Microseconds())
		} else {
			c.Batch.Window = time.Duration(n) * time.Microsecond
		}
	}
	if v := strings.TrimSpace(getenv(lockcfg.EnvProofSigningKey)); v != "" {
		k, err := fenceproof.ParseSigningKey(v)
		if err != nil {
			// The value is a secret: the error names the key id at most.
			bad("%s: %v (make one with: lockctl proof-key)", lockcfg.EnvProofSigningKey, err)
		} else {
			c.ProofKey = k
		}
	}
	if v := getenv(lockcfg.EnvLogLevel); v != "" {
		if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil || strings.ContainsAny(v, "+-") {
			bad("%s=%q: want debug, info, warn or error", lockcfg.EnvLogLevel, v)
		}
	}
	if err := errors.Join(append(errs, c.Validate())...); err != nil {
		return c, err
	}
	return c, nil
}

// Validate returns nil or one error per missing or contradictory setting,
// joined, each wrapping errInvalidConfig and naming its variable. Only the
// chosen store's settings are checked.
func (c config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{errInvalidConfig}, a...)...))
	}
	switch c.Store {
	case "postgres":
		if c.LockDB.DSN == "" {
			bad("%s=postgres needs %s (a PostgreSQL DSN)", lockcfg.EnvStore, lockcfg.EnvLockDBURL)
		} else if err := c.LockDB.Validate(); err != nil {
			bad("%s, %s: %v", lockcfg.EnvLockDBURL, lockcfg.EnvLockDBMaxConns, strings.ReplaceAll(err.Error(), "\n", "; "))
		}
	case "etcd":
		if len(c.Etcd.Endpoints) == 0 {
			bad("%s=etcd needs %s (comma-separated client URLs)", lockcfg.EnvStore, lockcfg.EnvEtcdEndpoints)
		}
		if err := c.Etcd.Validate(); err != nil && len(c.Etcd.Endpoints) > 0 && prefixOK(c.Etcd.Prefix) {
			bad("%s, %s, %s: %v", lockcfg.EnvEtcdEndpoints, lockcfg.EnvEtcdIdleLeases, lockcfg.EnvRequestTimeoutMs, strings.ReplaceAll(err.Error(), "\n", "; "))
		}
	default:
		bad("%s=%q: want postgres or etcd", lockcfg.EnvStore, c.Store)
	}
	if !prefixOK(c.Etcd.Prefix) {
		bad("%s=%q: want a key prefix that starts and ends with /", lockcfg.EnvEtcdPrefix, c.Etcd.Prefix)
	}
	if c.Addr == "" {
		bad("%s is empty", lockcfg.EnvHTTPAddr)
	}
	if c.RequestTimeout <= 0 {
		bad("%s: RequestTimeout %v is not positive", lockcfg.EnvRequestTimeoutMs, c.RequestTimeout)
	}
	if c.StallProbeTimeout <= 0 || c.StallProbeTimeout > maxStallProbeTimeoutMs*time.Millisecond {
		bad("%s: StallProbeTimeout %v is outside (0, %v]", lockcfg.EnvStallProbeTimeoutMs, c.StallProbeTimeout, maxStallProbeTimeoutMs*time.Millisecond)
	}
	if c.ShutdownTimeout <= 0 {
		bad("%s: ShutdownTimeout %v is not positive", lockcfg.EnvShutdownTimeoutMs, c.ShutdownTimeout)
	}
	return errors.Join(errs...)
}

func prefixOK(p string) bool { return strings.HasPrefix(p, "/") && strings.HasSuffix(p, "/") }
