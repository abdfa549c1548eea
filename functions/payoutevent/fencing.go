package payoutevent

// The fencing vocabulary both fence points share (payment-resource and
// rail-proxy), spelled here once: this package is the pipeline's
// standard-library-only wire package, so that payment-resource's api
// package, rail-proxy and functions/fencing can all refer to the same
// constants without one fence point depending on the other.
const (
	// HeaderFencingToken carries a lock holder's fencing token on every
	// fenced write: a positive decimal int64 in canonical form (no sign,
	// no leading zero), sent exactly once.
	HeaderFencingToken = "X-Fencing-Token"
	// HeaderLockOwner carries the holder's owner id. It is recorded and
	// logged, never trusted for a decision.
	HeaderLockOwner = "X-Lock-Owner"
	// MaxLockOwnerLen is the longest HeaderLockOwner a fence point
	// accepts, in bytes (lock-server's owner bound); a longer one, or one
	// lock-server would not grant a lease to, is refused 400.
	MaxLockOwnerLen = 128
	// CodeFencedOut is the error code (sent with 409) of a write a fence
	// point refused because a higher token (or, at a strict fence, the
	// same one) has written: the writer is a stale holder and must stop.
	CodeFencedOut = "FENCED_OUT"
	// EventFencedOut is the log event of every such refusal, with the
	// attributes resource, resourceId, presentedToken, highestToken and
	// ownerId.
	EventFencedOut = "fenced_out"
	// EventFencingDisabled is the WARN event a fence point logs once at
	// start when its kill switch turned fencing off.
	EventFencingDisabled = "fencing_disabled"
)
