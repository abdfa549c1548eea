// Package fencing is the runtime side of a fence point: it reads a lock
// holder's headers from a request (TokenFrom, ProofFrom, OwnerFrom),
// verifies the token's proof (Verify), logs and counts each refusal
// (Refusal.Log, LogUnverified, Collectors) and reads the kill switch
// (Switch). The names on the wire are in functions/fencing/fencewire;
// docs/payout-pipeline.md says why a fence lives in the resource.
package fencing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	lockapi "github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
)

// Errors of this package.
var (
	// ErrMissingToken: the request has no X-Fencing-Token header.
	ErrMissingToken = errors.New("fencing: missing " + fencewire.HeaderToken + " header")
	// ErrBadToken: the header is not a positive decimal integer.
	ErrBadToken = errors.New("fencing: malformed " + fencewire.HeaderToken + " header")
	// ErrBadOwner: the X-Lock-Owner header is sent more than once, or is
	// not an owner id lock-server would grant a lease to
	// (lockserver/api.ValidateOwner).
	ErrBadOwner = errors.New("fencing: malformed " + fencewire.HeaderOwner + " header")
	// ErrRepeatedProof: the X-Fencing-Proof header is sent more than once:
	// which proof was meant is unknown (see ProofFrom).
	ErrRepeatedProof = errors.New("fencing: more than one " + fencewire.HeaderProof + " header")
	// ErrUnverified: the token's proof does not show that lock-server
	// issued it for the lock that guards the resource (see Verify).
	ErrUnverified = errors.New("fencing: token not issued for this resource's lock")
)

// ProofFrom returns the X-Fencing-Proof header: "" and nil when it is
// absent (Verify then refuses the token as unproven), and "" and an error
// wrapping ErrRepeatedProof when it is sent more than once (a fence point
// answers it like a proof that does not verify, and says so).
func ProofFrom(r *http.Request) (string, error) {
	vals := r.Header.Values(fencewire.HeaderProof)
	switch len(vals) {
	case 0:
		return "", nil
	case 1:
		return strings.TrimSpace(vals[0]), nil
	}
	return "", fmt.Errorf("%w: sent %d times", ErrRepeatedProof, len(vals))
}

// Verify checks that proof shows token was granted by lock-server on
// lockKey, the lock that guards the resource (payoutevent.Event.LockKey
// for an account). It returns nil or an error wrapping ErrUnverified and
// the fenceproof error that says why (ErrMissing, ErrMalformed,
// ErrUnknownKey, ErrInvalid). A fence point calls it before its fenced
// statement, and changes nothing when it fails: a token the lock service
// did not issue for this lock must never raise a high-water mark.
func Verify(keys fenceproof.Keyring, proof, lockKey string, token int64) error {
	if _, err := keys.VerifyGrant(proof, lockKey, token); err != nil {
		return fmt.Errorf("%w: %w", ErrUnverified, err)
	}
	return nil
}

// CheckProof judges proof's form alone, without keys: nil, or an error
// wrapping ErrUnverified and fenceproof.ErrMissing or ErrMalformed, as
// Verify would answer it. A fence point calls it before it is admitted to
// database work, so that a missing or malformed proof is refused (403)
// whatever the database's state; only the signature check, which needs
// the resource's lock key from the database, comes after.
func CheckProof(proof string) error {
	if err := fenceproof.CheckGrant(proof); err != nil {
		return fmt.Errorf("%w: %w", ErrUnverified, err)
	}
	return nil
}

// ParseKeys reads the fence points' LOCK_PROOF_KEYS value (v, from
// variable name) into a Keyring: fenceproof.ParseKeyring, with the error
// naming the variable.
func ParseKeys(name, v string) (fenceproof.Keyring, error) {
	k, err := fenceproof.ParseKeyring(v)
	if err != nil {
		return fenceproof.Keyring{}, fmt.Errorf("%s: %w (make a key pair with: lockctl proof-key)", name, err)
	}
	return k, nil
}

// TokenFrom returns the fencing token of r: ErrMissingToken without the
// header, ErrBadToken (wrapped) when it is not a single positive decimal
// int64 in canonical form (no sign, no leading zero: the token's one
// spelling, as lock-server writes it).
func TokenFrom(r *http.Request) (int64, error) {
	vals := r.Header.Values(fencewire.HeaderToken)
	if len(vals) == 0 {
		return 0, ErrMissingToken
	}
	if len(vals) > 1 {
		return 0, fmt.Errorf("%w: sent %d times", ErrBadToken, len(vals))
	}
	v := strings.TrimSpace(vals[0])
	t, err := strconv.ParseInt(v, 10, 64)
	if err != nil || t <= 0 || v[0] == '+' || v[0] == '0' {
		return 0, fmt.Errorf("%w: %q is not a positive integer", ErrBadToken, vals[0])
	}
	return t, nil
}

// OwnerFrom returns the X-Lock-Owner header of r, "" when it is absent
// (the header is optional: it is recorded and logged, never trusted). A
// header sent is held to lock-server's rule for owner ids
// (lockserver/api.ValidateOwner: 1..fencewire.MaxOwnerLen bytes of
// ASCII letters, digits and . _ : - @ /), since an owner that holds a
// lease can only be one of those: anything else (invalid UTF-8, control
// characters, a longer id, a repeated header) is refused with ErrBadOwner
// (wrapped), never cut or stored. The error's text quotes at most the
// offending byte, escaped.
func OwnerFrom(r *http.Request) (string, error) {
	vals := r.Header.Values(fencewire.HeaderOwner)
	switch len(vals) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", fmt.Errorf("%w: sent %d times", ErrBadOwner, len(vals))
	}
	if err := lockapi.ValidateOwner(vals[0]); err != nil {
		return "", fmt.Errorf("%w: %v", ErrBadOwner, err)
	}
	return vals[0], nil
}

// Refusal describes one write refused by a fence point.
type Refusal struct {
	// Resource names the kind of thing protected ("account", "payout",
	// "rail").
	Resource string
	// ResourceID is the protected instance (an account id, a payout id).
	ResourceID string
	// PresentedToken is the token of the refused write.
	PresentedToken int64
	// HighestToken is the highest token the fence point had accepted.
	HighestToken int64
	// Owner is the refused holder's owner id, as it claimed it.
	Owner string
}

// Error describes the refusal in one line.
func (f Refusal) Error() string {
	return fmt.Sprintf("fenced out: %s %s has accepted token %d; token %d is stale", f.Resource, f.ResourceID, f.HighestToken, f.PresentedToken)
}

// Resources are the kinds of thing a fence point protects, and the only
// values of the resource label of fence_refusals_total.
var Resources = []string{"account", "payout", "rail"}

// refusals counts the refusals logged, by resource; Collectors exposes it.
var refusals = func() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fence_refusals_total",
		Help: "Writes refused by a fence point because their fencing token was stale, by resource (account, payout, rail).",
	}, []string{"resource"})
	for _, r := range Resources {
		c.WithLabelValues(r) // present at 0, so that rates and alerts see it
	}
	return c
}()

// unverified counts the writes refused for an unverified token, by
// resource; Collectors exposes it.
var unverified = func() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fence_unverified_tokens_total",
		Help: "Writes refused by a fence point because lock-server did not sign their token for the resource's lock, by resource (account, payout, rail).",
	}, []string{"resource"})
	for _, r := range Resources {
		c.WithLabelValues(r)
	}
	return c
}()

// LogUnverified writes (with ctx, so that the line carries the request's
// trace id: internal/logjson) the unverified_token event at WARN (resource,
// resourceId, presentedToken, ownerId, reason, plus extra) and counts it
// in fence_unverified_tokens_total (see Collectors).
func LogUnverified(ctx context.Context, log *slog.Logger, resource, resourceID string, token int64, owner string, reason error, extra ...any) {
	label := "other"
	if slices.Contains(Resources, resource) {
		label = resource
	}
	unverified.WithLabelValues(label).Inc()
	attrs := append([]any{"event", fencewire.EventUnverifiedToken, "resource", resource, "resourceId", resourceID,
		"presentedToken", token, "ownerId", owner, "reason", reason.Error()}, extra...)
	log.WarnContext(ctx, "fencing token not verified", attrs...)
}

// Collectors returns the fence points' metrics:
//
//	fence_refusals_total{resource}            counter, one per Refusal.Log
//	fence_unverified_tokens_total{resource}   counter, one per LogUnverified
//
// resource is one of Resources ("other" for anything else); the resource
// id, the tokens and the owner are in the fenced_out log event only (the
// cardinality rule). They are for the Collectors of the two services that
// hold a fence point
// (paymentresource.Collectors, railproxy.Collectors). A process without a
// fence point (the executor, rail-stub, the reconciler) serves neither.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{refusals, unverified}
}

// Log writes (with ctx, so that the line carries the request's trace id:
// internal/logjson) the fenced_out event at WARN with the attributes every fence
// point logs (docs/log-events.md): resource, resourceId, presentedToken, highestToken, ownerId, plus
// any extra attributes (payoutId, ...), and counts it in
// fence_refusals_total (see Collectors).
func (f Refusal) Log(ctx context.Context, log *slog.Logger, extra ...any) {
	label := "other"
	if slices.Contains(Resources, f.Resource) {
		label = f.Resource
	}
	refusals.WithLabelValues(label).Inc()
	attrs := append([]any{
		"event", fencewire.EventFencedOut, "resource", f.Resource, "resourceId", f.ResourceID,
		"presentedToken", f.PresentedToken, "highestToken", f.HighestToken, "ownerId", f.Owner,
	}, extra...)
	log.WarnContext(ctx, "stale fencing token refused", attrs...)
}

// Switch reads a kill switch from the environment value v ("" means the
// default, on). It accepts true/false, 1/0, on/off, yes/no.
func Switch(name, v string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "true", "1", "on", "yes":
		return true, nil
	case "false", "0", "off", "no":
		return false, nil
	}
	return false, fmt.Errorf("%s=%q: want true or false", name, v)
}

// WarnIfOff logs at WARN, once at start, that a fence point is disabled.
// Fencing off exists only so the experiment can show the corruption.
func WarnIfOff(log *slog.Logger, name string, on bool) {
	if !on {
		log.Warn("fencing is DISABLED: stale lock holders will be accepted; use only inside the fencing experiment",
			"event", fencewire.EventFencingDisabled, "switch", name)
	}
}
