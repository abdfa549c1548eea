package railproxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
)

// Signed payout terms.
//
// A lease on payout:{account} is the right to send that account's payouts;
// it says nothing about which payouts exist. Without this check a holder
// of any valid grant could have rail-proxy forward a payout id paydb does
// not know, or a known one with another amount, currency or account, and
// only the reconciler's audit would see the money afterwards. So the ledger
// speaks for the terms: payment-resource signs every payout it answers
// (fencewire.PayoutTerms: payout id, account id, amount in minor units,
// currency, everything rail-proxy sends to the rail), the executor passes
// the signature on (header api.HeaderTermsSignature), and rail-proxy
// checks it against payment-resource's public keys (Config.TermsKeys)
// before anything else reads or writes raildb: a refusal records no
// attempt, moves no high-water mark, and never reaches the rail.
//
// A refusal says which of three things went wrong, because callers must
// act differently on them: a known key's signature over other terms
// (ErrInvalidTerms, 403 INVALID_TERMS) is about this payout and
// permanent; an unknown key id (ErrTermsKeyUnknown, 403 TERMS_KEY_UNKNOWN,
// retryable) is a key rotation rail-proxy has not caught up with; no
// usable signature (ErrTermsUnsigned, 403 TERMS_UNSIGNED) is a caller that
// does not send one. fenceproof's Verify tells them apart.
//
// The signature travels in a header rather than the body so that a
// rail-proxy older than the check ignores it; the previous version's body
// member is still read for one release (api.SubmitRequest.BodyTermsSignature).
//
// The check is authenticity, not fencing: it stays on when the kill
// switch turns fencing off, so the experiment still shows what a stale
// holder does and nothing else. It does not order holders (the fence
// does) and does not stop a second submission of a payout (rail_payout
// does). Config.TermsNotRequired lets a request without any signature
// through, for a rolling deploy only.

// Errors of the terms check. Each wraps the fenceproof error that says
// why (ErrMissing, ErrMalformed, ErrUnknownKey, ErrInvalid).
var (
	// ErrInvalidTerms: the terms signature names a key of
	// Config.TermsKeys but does not cover exactly the request's payout id,
	// account id, amount and currency (403 INVALID_TERMS): these terms are
	// not the ledger's; permanent for the payout.
	ErrInvalidTerms = errors.New("railproxy: payout terms not signed by payment-resource")
	// ErrTermsKeyUnknown: the terms signature names a key id that is not
	// in Config.TermsKeys (403 TERMS_KEY_UNKNOWN, retryable): a deployment
	// fault that clears once the key is added.
	ErrTermsKeyUnknown = errors.New("railproxy: payout terms signed by a key rail-proxy does not hold")
	// ErrTermsUnsigned: no usable terms signature, missing or malformed
	// (403 TERMS_UNSIGNED).
	ErrTermsUnsigned = errors.New("railproxy: payout terms carry no usable signature")
)

// termsSignature returns the terms signature of r: its
// api.HeaderTermsSignature, or, when that is absent or empty, body (the
// previous version's body member). It returns an error wrapping
// ErrInvalidRequest when the header is sent more than once, or when both
// are sent and differ (which one would be the caller's?).
func termsSignature(r *http.Request, body string) (string, error) {
	vals := r.Header.Values(api.HeaderTermsSignature)
	if len(vals) > 1 {
		return "", fmt.Errorf("%w: header %s sent %d times; send it once", ErrInvalidRequest, api.HeaderTermsSignature, len(vals))
	}
	header := ""
	if len(vals) == 1 {
		header = vals[0]
	}
	switch {
	case header == "":
		return body, nil
	case body != "" && body != header:
		return "", fmt.Errorf("%w: header %s and the body member termsSignature differ; send the header only", ErrInvalidRequest, api.HeaderTermsSignature)
	}
	return header, nil
}

// verifyTerms checks req.Signature() against Config.TermsKeys over req's
// own terms. On a refusal it logs EventTermsRefused at WARN (the terms,
// the holder's token and owner, the code, the reason) and returns an error
// wrapping ErrInvalidTerms, ErrTermsKeyUnknown or ErrTermsUnsigned; it
// touches neither raildb nor the rail. With Config.TermsNotRequired, a
// request without any signature passes (EventTermsUnsigned at WARN).
func (p *Proxy) verifyTerms(ctx context.Context, req api.SubmitRequest, h fencewire.Holder) error {
	sig := req.Signature()
	attrs := []any{"payoutId", req.PayoutID, "accountId", req.AccountID, "amountMinor", req.AmountMinor, "currency", req.Currency,
		"token", h.Token, "ownerId", h.Owner}
	if sig == "" && p.cfg.TermsNotRequired {
		p.log.WarnContext(ctx, "payout terms without a signature let through: terms are not required ("+api.EnvTermsRequired+"=false)",
			append([]any{"event", api.EventTermsUnsigned}, attrs...)...)
		return nil
	}
	_, err := p.cfg.TermsKeys.Verify(sig, fencewire.PayoutTermsDomain, req.Terms().Fields()...)
	if err == nil {
		return nil
	}
	refusal := ErrTermsUnsigned // fenceproof.ErrMissing, ErrMalformed
	switch {
	case errors.Is(err, fenceproof.ErrInvalid):
		refusal = ErrInvalidTerms
	case errors.Is(err, fenceproof.ErrUnknownKey):
		refusal = ErrTermsKeyUnknown
	}
	_, code, _ := statusOf(refusal)
	p.log.WarnContext(ctx, "payout terms refused: payment-resource's signature over them is not verified", append([]any{"event", api.EventTermsRefused},
		append(attrs, "code", string(code), "reason", err.Error())...)...)
	return fmt.Errorf("%w: %w", refusal, err)
}
