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

// Signed payout terms. payment-resource signs the terms of every payout
// (fencewire.PayoutTerms), the executor passes the signature on
// (api.HeaderTermsSignature) and rail-proxy checks it against
// Config.TermsKeys before it reads or writes raildb, so a lease holder
// cannot forward a payout paydb does not know or with other terms. The
// check stays on when fencing is turned off; Config.TermsNotRequired lets
// a request without a signature through, for a rolling deploy only. See
// "Which numbers a fence point believes" in docs/payout-pipeline.md.

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
