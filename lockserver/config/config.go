// Package config names lock-server's environment variables: the ones
// lockserver/cmd/lock-server reads, which lockctl and the local stack set
// too. docs/configuration.md lists each with its default. The variable
// lock-server's clients read is lockserver/api.EnvServerURL.
package config

// Environment variables of lock-server's configuration. An unset or empty
// variable keeps the setting's default.
const (
	// EnvStore selects the backend: "postgres" (default) or "etcd".
	EnvStore = "LOCK_STORE"
	// EnvHTTPAddr is the listen address (host:port). Default: ":" + $PORT
	// when PORT is set, else 127.0.0.1:8080.
	EnvHTTPAddr = "LOCK_HTTP_ADDR"
	// EnvPort is the container platforms' port, used when EnvHTTPAddr is
	// empty.
	EnvPort = "PORT"
	// EnvLockDBURL is the PostgreSQL DSN of lockdb; required with
	// LOCK_STORE=postgres.
	EnvLockDBURL = "LOCKDB_URL"
	// EnvLockDBMaxConns caps lockdb's connection pool (a positive integer).
	EnvLockDBMaxConns = "LOCKDB_MAX_CONNS"
	// EnvLockDBAcceptPromotion, "true" or "false" (default), lets grants go
	// on after lockdb fails over to a promoted synchronous standby, which
	// ends on a new timeline (pgstore's Config.AcceptPromotion); set it
	// only when lockdb's standby is synchronous.
	EnvLockDBAcceptPromotion = "LOCKDB_ACCEPT_PROMOTION"
	// EnvEtcdEndpoints are etcd's client URLs, comma-separated; required
	// with LOCK_STORE=etcd.
	EnvEtcdEndpoints = "ETCD_ENDPOINTS"
	// EnvEtcdPrefix is the key prefix of lock keys in etcd (starts and ends
	// with "/").
	EnvEtcdPrefix = "ETCD_PREFIX"
	// EnvEtcdIdleLeases caps the idle etcd leases kept ahead of acquires;
	// 0 turns the pool off.
	EnvEtcdIdleLeases = "ETCD_IDLE_LEASES"
	// EnvRequestTimeoutMs bounds each backend call, in milliseconds.
	EnvRequestTimeoutMs = "LOCK_REQUEST_TIMEOUT_MS"
	// EnvShutdownTimeoutMs bounds the drain on SIGTERM, in milliseconds.
	EnvShutdownTimeoutMs = "LOCK_SHUTDOWN_TIMEOUT_MS"
	// EnvProofSigningKey is lock-server's secret signing key for grant
	// proofs (Grant.Proof), in lockserver/fenceproof's SigningKey form
	// "id:base64url"; unset: grants carry no proof. `lockctl proof-key`
	// makes one. A secret: Secret Manager or a Kubernetes Secret in the
	// cloud, never a default or a committed file.
	EnvProofSigningKey = "LOCK_PROOF_SIGNING_KEY"
	// EnvMaxInFlight bounds the lock requests lock-server serves at once
	// (a positive integer); more get 503 OVERLOADED at once.
	EnvMaxInFlight = "LOCK_MAX_IN_FLIGHT"
	// EnvStallProbeTimeoutMs bounds, in milliseconds, the one request let
	// through to probe a stalled backend; past it the probe is answered
	// 503 BACKEND_UNAVAILABLE with Retry-After.
	EnvStallProbeTimeoutMs = "LOCK_STALL_PROBE_TIMEOUT_MS"
	// EnvBatchEnabled turns group grant on or off: "true" (default) or
	// "false". On, concurrent acquires, releases and renewals share backend
	// round trips (lockserver.Batcher).
	EnvBatchEnabled = "LOCK_BATCH_ENABLED"
	// EnvHandoffEnabled turns the wait queue's handoff on or off: "true"
	// (default) or "false". On, a release answered by the lock-server
	// where the key's head waiter is parked grants it the key in the
	// release's own backend transaction (lockserver.ServerConfig.Handoff).
	EnvHandoffEnabled = "LOCK_HANDOFF_ENABLED"
	// EnvBatchMax is the most requests of one backend round trip when
	// batching (1 to 1024, default 64).
	EnvBatchMax = "LOCK_BATCH_MAX"
	// EnvBatchWindowUs is how long, in microseconds, a request that finds
	// no batch in flight waits for others before it is sent (0 to 100000,
	// default 0: requests coalesce only behind a batch in flight).
	EnvBatchWindowUs = "LOCK_BATCH_WINDOW_US"
	// EnvProofKeys is read by fence points, not by lock-server (it is
	// fencewire.EnvProofKeys): the public keys whose grant proofs they
	// accept, comma-separated VerifyKey forms "id:base64url" (more than one
	// while keys rotate). Not a secret. lockctl proof-key prints it.
	EnvProofKeys = "LOCK_PROOF_KEYS"
	// EnvLogLevel is debug, info, warn or error.
	EnvLogLevel = "LOG_LEVEL"
)
