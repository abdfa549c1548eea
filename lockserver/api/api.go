// Package api is the wire contract of lock-server's HTTP/JSON API: the
// paths, the request and response bodies, the error envelope and its stable
// error codes, and the validation rules for keys, owner ids and TTLs. It is
// a Go module of its own that imports only the standard library, so any
// client can depend on it without pulling in a backend; docs/lock-api.md is
// the same contract in prose.
//
// Durations on the wire are integer milliseconds (fields ending in "Ms"),
// instants RFC 3339 timestamps in UTC from the backend's clock, tokens
// positive JSON numbers. No field of a request may be JSON null: an
// optional field is left out.
//
// The API (every body is JSON, every error is an [ErrorEnvelope]):
//
//	POST /v1/locks/{key}/acquire  AcquireRequest -> 200 Grant | 409 LOCK_HELD, 503 BACKEND_RESTORED (with waitMs: a long-poll)
//	POST /v1/locks/{key}/renew    RenewRequest   -> 200 Grant | 409 LEASE_NOT_HELD, STALE_TOKEN
//	POST /v1/locks/{key}/release  ReleaseRequest -> 204       | 409 LEASE_NOT_HELD, STALE_TOKEN
//	POST /v1/locks/{key}/revoke   RevokeRequest  -> 200 Grant (the revoked lease) | 409 LEASE_NOT_HELD, STALE_TOKEN
//	GET  /v1/locks/{key}                         -> 200 LockState
//	GET  /healthz                                -> 200 when the process serves HTTP
//	GET  /readyz                                 -> 200 when the backend answers a ping within the server's
//	                                                ReadyTimeout (1 s by default), 503 BACKEND_UNAVAILABLE otherwise
package api

import (
	"fmt"
	"time"
)

// Paths of the lock API. Each lock route has the key as its only path
// parameter; see [ValidateKey] for what a key may contain.
const (
	// PathLockPrefix is the prefix of every per-key route: PathLockPrefix + key
	// addresses the lock (GET inspects it) and PathLockPrefix + key + "/acquire"
	// and so on address its operations.
	PathLockPrefix = "/v1/locks/"
	// SuffixAcquire, SuffixRenew, SuffixRelease and SuffixRevoke end the
	// operation routes.
	SuffixAcquire = "/acquire"
	SuffixRenew   = "/renew"
	SuffixRelease = "/release"
	SuffixRevoke  = "/revoke"
	// PathHealth answers 200 while the process serves HTTP (liveness).
	PathHealth = "/healthz"
	// PathReady answers 200 when the backend answers a ping (readiness).
	PathReady = "/readyz"
	// HeaderTimeoutMs, sent by a caller, is the time it will still wait for
	// the answer, in milliseconds: once, as a decimal integer without sign
	// or leading zero, MinRequestTimeoutMs..MaxRequestTimeoutMs; anything
	// else is refused 400 INVALID_REQUEST before anything is done.
	// lock-server then gives its backend at most that minus its margin
	// (100 ms), so that a 503 arrives before the caller gives up. The SDK
	// sends it on every call (capped at MaxRequestTimeoutMs), and sends no
	// call at all with less than MinRequestTimeoutMs left.
	HeaderTimeoutMs = "X-Request-Timeout-Ms"
)

// Bounds enforced on every request. A request outside them is answered 400
// INVALID_REQUEST (or 413 BODY_TOO_LARGE) and changes nothing.
const (
	// MaxKeyLen is the longest lock key, in bytes.
	MaxKeyLen = 128
	// MaxOwnerLen is the longest owner id, in bytes.
	MaxOwnerLen = 128
	// MinTTLMs is the shortest lease a client may ask for, in milliseconds.
	// Backends may round a TTL up (etcd grants whole seconds and has a floor
	// of its own); the granted TTL is always returned in Grant.TTLMs.
	MinTTLMs = 500
	// MaxTTLMs is the longest lease a client may ask for, in milliseconds
	// (10 minutes). Longer leases turn a crashed holder into a long outage.
	MaxTTLMs = 600_000
	// MaxBodyBytes is the largest request body accepted, in bytes.
	MaxBodyBytes = 4096
	// MinRequestTimeoutMs is the smallest HeaderTimeoutMs accepted, in
	// milliseconds. lock-server keeps 100 ms of a budget for its answer,
	// so this leaves the backend call at least 200 ms. A shorter call
	// mostly runs out (measured on PostgreSQL on a loaded two-core machine:
	// budgets of 1 to 150 ms were answered 503 nearly every time), and a
	// grant cut by its deadline is often committed all the same (9 to 62%
	// of those 503s left a lease standing until its TTL, held by a caller
	// that was told 503). At 200 ms, no call ran out. A caller with less
	// time left than this should not send the request: nothing is done.
	MinRequestTimeoutMs = 300
	// MaxRequestTimeoutMs is the largest HeaderTimeoutMs accepted, in
	// milliseconds (one hour; a caller that waits longer sends this).
	MaxRequestTimeoutMs = 3_600_000
)

// AcquireRequest asks for a lease on the key in the path. Without WaitMs
// the grant is refused with LOCK_HELD at once while another unexpired lease
// exists on the key (barging; the SDK retries with jittered backoff). With
// WaitMs the request is a long-poll: lock-server queues it behind the
// earlier waiting acquires of the key that reached the same lock-server,
// in arrival order, and grants it when it is at the head of that queue and
// the backend grants the key, or answers LOCK_HELD once WaitMs has passed
// (or the caller's X-Request-Timeout-Ms budget, minus lock-server's
// margin, if that ends first). The queue is per lock-server process: the
// backend stays the arbiter, and an acquire through another lock-server
// may take the key first.
type AcquireRequest struct {
	// Owner identifies the holder; see ValidateOwner. Required.
	Owner string `json:"owner"`
	// TTLMs is the requested lease duration in milliseconds, within
	// [MinTTLMs, MaxTTLMs]. Required.
	TTLMs int64 `json:"ttlMs"`
	// WaitMs is how long, in milliseconds, the request may wait in the
	// key's queue for the lease: 0 (or absent) never waits, otherwise
	// within [MinWaitMs, MaxWaitMs]; see ValidateWaitMs. The TTL of a
	// grant starts when the backend grants it, not when the request
	// arrived. Optional.
	WaitMs int64 `json:"waitMs,omitempty"`
}

// Bounds of AcquireRequest.WaitMs.
const (
	// MinWaitMs is the shortest wait an acquire may ask for, in
	// milliseconds (a shorter one is not a wait worth a queue place).
	MinWaitMs = 10
	// MaxWaitMs is the longest wait one acquire may ask for, in
	// milliseconds (60 s). A waiter keeps its place in the queue only for
	// one request, so longer waits are fairer, but every proxy on the way
	// must keep the request open that long (a GKE load balancer's default
	// backend timeout is 30 s): keep waits below the shortest such timeout.
	MaxWaitMs = 60_000
)

// RenewRequest extends the lease identified by (key, Owner, Token) by its
// granted TTL, measured from the moment the backend processes the renewal.
// It succeeds only while that exact lease is unexpired.
type RenewRequest struct {
	// Owner must equal the owner the lease was granted to. Required.
	Owner string `json:"owner"`
	// Token is the fencing token of the grant being renewed. Required, > 0.
	Token int64 `json:"token"`
}

// ReleaseRequest ends the lease identified by (key, Owner, Token). A release
// carrying an older token than the current grant never touches the newer
// lease: it is refused with STALE_TOKEN.
type ReleaseRequest struct {
	// Owner must equal the owner the lease was granted to. Required.
	Owner string `json:"owner"`
	// Token is the fencing token of the grant being released. Required, > 0.
	Token int64 `json:"token"`
}

// RevokeRequest is an operator's force-revoke of the lease on a key,
// whoever holds it. It is the break-glass path: the revoked holder is not
// told, and only the fence points stop it from writing afterwards.
type RevokeRequest struct {
	// Token, when > 0, makes the revoke conditional: it succeeds only if the
	// live lease carries exactly this token (STALE_TOKEN if a newer one does).
	// 0 revokes whatever lease is live.
	Token int64 `json:"token,omitempty"`
	// Reason is free text recorded in the server's log: at most
	// MaxReasonLen bytes of UTF-8 without control characters (a newline,
	// a tab, an escape), or 400 INVALID_REQUEST.
	Reason string `json:"reason,omitempty"`
}

// MaxReasonLen is the longest RevokeRequest.Reason, in bytes.
const MaxReasonLen = 256

// Grant describes one lease: the answer to acquire and renew, and the lease
// removed by revoke.
type Grant struct {
	// Key is the lock key.
	Key string `json:"key"`
	// Owner is the holder the lease was granted to.
	Owner string `json:"owner"`
	// Token is the fencing token: strictly greater than the token of every
	// earlier grant of this key, across restarts of lock-server and of the
	// backend. Present it to every fence point.
	Token int64 `json:"token"`
	// LeaseID identifies the lease in the backend, for diagnostics only
	// (the etcd lease id in hex; "pg-" and the token for PostgreSQL). It
	// names this grant and no other: no other grant, of any key, ever
	// reports the same LeaseID.
	LeaseID string `json:"leaseId"`
	// TTLMs is the granted lease duration in milliseconds; it may be longer
	// than requested when the backend rounds up.
	TTLMs int64 `json:"ttlMs"`
	// ExpiresAt is the backend's estimate of when the lease expires unless
	// renewed. It is informative: clients must not compare it with their own
	// clock, and the SDK computes its deadline from TTLMs instead.
	ExpiresAt time.Time `json:"expiresAt"`
	// Proof, present in the answers to acquire and renew when lock-server
	// has a signing key (EnvProofSigningKey), is lock-server's signature
	// over Key and Token (package lockserver/fenceproof). Send it with the
	// token, unchanged, to every fence point that verifies tokens (the
	// payout pipeline's are: header X-Fencing-Proof). Opaque to holders.
	Proof string `json:"proof,omitempty"`
	// WaitedMs, in the answer to an acquire that asked to wait
	// (AcquireRequest.WaitMs), is how long lock-server held the request
	// before the backend call that granted it, in milliseconds, by
	// lock-server's clock; the TTL started no earlier. The SDK counts it,
	// less its drift allowance and never more than the round trip it
	// measured, into the lease's local deadline. Absent otherwise.
	WaitedMs int64 `json:"waitedMs,omitempty"`
}

// LockState is the answer to inspect.
type LockState struct {
	// Key is the lock key.
	Key string `json:"key"`
	// Held is true when an unexpired lease exists, by the backend's clock.
	Held bool `json:"held"`
	// Lease is the live lease when Held, otherwise absent.
	Lease *Grant `json:"lease,omitempty"`
	// LastToken is the highest token ever granted on this key that the
	// backend still remembers (0 when it remembers none; etcd forgets a key
	// once its lease ends, PostgreSQL keeps it forever).
	LastToken int64 `json:"lastToken"`
}

// Code is a stable, machine-readable error code. Codes are never renamed or
// reused; new ones may be added.
type Code string

// Error codes of the lock API, with the HTTP status each is sent with.
const (
	// CodeLockHeld (409): another unexpired lease exists on the key. Retryable.
	CodeLockHeld Code = "LOCK_HELD"
	// CodeLeaseNotHeld (409): the presented lease is not live: it expired, was
	// released or revoked, or never existed, and no newer grant is visible.
	CodeLeaseNotHeld Code = "LEASE_NOT_HELD"
	// CodeStaleToken (409): a newer grant of the key exists; the presented
	// token is older than it.
	CodeStaleToken Code = "STALE_TOKEN"
	// CodeInvalidRequest (400): the request is malformed or out of bounds.
	CodeInvalidRequest Code = "INVALID_REQUEST"
	// CodeBodyTooLarge (413): the body exceeds MaxBodyBytes.
	CodeBodyTooLarge Code = "BODY_TOO_LARGE"
	// CodeUnsupportedMediaType (415): the body is not application/json.
	CodeUnsupportedMediaType Code = "UNSUPPORTED_MEDIA_TYPE"
	// CodeNotFound (404): no such route.
	CodeNotFound Code = "NOT_FOUND"
	// CodeMethodNotAllowed (405): the route exists for another method.
	CodeMethodNotAllowed Code = "METHOD_NOT_ALLOWED"
	// CodeBackendUnavailable (503): the backend did not answer in time. The
	// outcome of the operation is unknown. Retryable.
	CodeBackendUnavailable Code = "BACKEND_UNAVAILABLE"
	// CodeBackendRestored (503): acquire only. The backend is not provably
	// the one the service issued its tokens on (it was restored from a
	// backup or snapshot, rolled back, or failed over to a copy), so a new
	// token could repeat one already issued. Grants are refused until an
	// operator runs "lockctl advance --past N"; renew, release, revoke and
	// inspect are still answered. Not retryable by the caller: only the
	// operator's step clears it (see docs/runbooks/lockdb-restore.md).
	CodeBackendRestored Code = "BACKEND_RESTORED"
	// CodeOverloaded (503): lock-server holds as many requests as it
	// serves at once; this one was refused before anything was done (the
	// outcome is known: nothing happened). Retryable, after Retry-After.
	CodeOverloaded Code = "OVERLOADED"
	// CodeInternal (500): a bug. Not retryable.
	CodeInternal Code = "INTERNAL"
	// CodeRequestCancelled (StatusRequestCancelled, 499): the caller's
	// request ended (cancelled, or its connection closed) before
	// lock-server could answer, typically while it waited in a key's
	// queue. The caller never reads this answer; the outcome of the
	// operation is unknown to it, as for BACKEND_UNAVAILABLE. It exists so
	// that lock-server's logs and metrics tell a caller giving up from the
	// backend failing (it is not an error of the acquire availability
	// SLO).
	CodeRequestCancelled Code = "REQUEST_CANCELLED"
)

// StatusRequestCancelled is the status of CodeRequestCancelled: 499, the
// status proxies (nginx first) use for a request its client closed. It is
// recorded, never read by the caller.
const StatusRequestCancelled = 499

// ErrorEnvelope is the body of every non-2xx response.
type ErrorEnvelope struct {
	// Error is the refusal.
	Error ErrorBody `json:"error"`
}

// ErrorBody carries the stable code, a human-readable message (not stable;
// do not parse it) and whether repeating the same request may succeed.
type ErrorBody struct {
	// Code is one of the Code constants.
	Code Code `json:"code"`
	// Message is for people; it may change between versions.
	Message string `json:"message"`
	// Retryable is Code.Retryable(), sent for clients without this package.
	Retryable bool `json:"retryable"`
}

// Retryable reports whether the code marks a condition that may clear if the
// identical request is sent again later.
func (c Code) Retryable() bool {
	return c == CodeLockHeld || c == CodeBackendUnavailable || c == CodeOverloaded
}

// ValidateKey returns an error unless key is 1..MaxKeyLen bytes, starts with
// an ASCII letter or digit, and contains only ASCII letters, digits and
// '.', '_', ':', '-'. Keys therefore never need escaping in a URL path.
// The payout pipeline uses keys of the form "payout:{account_id}".
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("key is empty")
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("key is %d bytes, longer than %d", len(key), MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if isAlnum(c) || (i > 0 && (c == '.' || c == '_' || c == ':' || c == '-')) {
			continue
		}
		return fmt.Errorf("key has byte %q at offset %d; allowed: letters, digits, and . _ : - after the first byte", key[i:i+1], i)
	}
	return nil
}

// ValidateOwner returns an error unless owner is 1..MaxOwnerLen bytes of ASCII
// letters, digits and '.', '_', ':', '-', '@', '/'.
func ValidateOwner(owner string) error {
	if owner == "" {
		return fmt.Errorf("owner is empty")
	}
	if len(owner) > MaxOwnerLen {
		return fmt.Errorf("owner is %d bytes, longer than %d", len(owner), MaxOwnerLen)
	}
	for i := 0; i < len(owner); i++ {
		c := owner[i]
		if isAlnum(c) || c == '.' || c == '_' || c == ':' || c == '-' || c == '@' || c == '/' {
			continue
		}
		return fmt.Errorf("owner has byte %q at offset %d; allowed: letters, digits, and . _ : - @ /", owner[i:i+1], i)
	}
	return nil
}

// ValidateTTLMs returns an error unless ttlMs is within [MinTTLMs, MaxTTLMs].
func ValidateTTLMs(ttlMs int64) error {
	if ttlMs < MinTTLMs || ttlMs > MaxTTLMs {
		return fmt.Errorf("ttlMs is %d; it must be between %d and %d milliseconds", ttlMs, MinTTLMs, MaxTTLMs)
	}
	return nil
}

// ValidateWaitMs returns an error unless waitMs is 0 (no wait) or within
// [MinWaitMs, MaxWaitMs].
func ValidateWaitMs(waitMs int64) error {
	if waitMs != 0 && (waitMs < MinWaitMs || waitMs > MaxWaitMs) {
		return fmt.Errorf("waitMs is %d; it must be 0 (no wait) or between %d and %d milliseconds", waitMs, MinWaitMs, MaxWaitMs)
	}
	return nil
}

// ValidateToken returns an error unless token is positive.
func ValidateToken(token int64) error {
	if token <= 0 {
		return fmt.Errorf("token is %d; fencing tokens are positive", token)
	}
	return nil
}

func isAlnum(c byte) bool {
	return ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9')
}

// EnvServerURL is the environment variable from which lock-server's
// clients (lockctl, the executor, the reconciler) read its base URL.
const EnvServerURL = "LOCK_SERVER_URL"
