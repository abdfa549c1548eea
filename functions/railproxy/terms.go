package railproxy

import (
	"context"
	"errors"
	"fmt"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
)

// Signed payout terms (issue #15, probe item 12).
//
// A lease on payout:{account} is the right to send that account's payouts;
// it says nothing about which payouts exist. Without this check a holder
// of any valid grant could have rail-proxy forward a payout id paydb does
// not know, or a known one with another amount, currency or account, and
// only the reconciler's audit would see the money afterwards. So the ledger
// speaks for the terms: payment-resource signs every payout it answers
// (payoutevent.PayoutTerms: payout id, account id, amount in minor units,
// currency, everything rail-proxy sends to the rail), the executor passes
// the signature on (api.SubmitRequest.TermsSignature), and rail-proxy
// checks it against payment-resource's public keys (Config.TermsKeys)
// before anything else reads or writes raildb: a refusal records no
// attempt, moves no high-water mark, and never reaches the rail.
//
// The check is authenticity, not fencing: it stays on when the kill
// switch turns fencing off, so the experiment still shows what a stale
// holder does and nothing else. It does not order holders (the fence
// does) and does not stop a second submission of a payout (rail_payout
// does).

// ErrInvalidTerms: the submission's terms signature is missing, malformed,
// made by a key not in Config.TermsKeys, or does not cover exactly its
// payout id, account id, amount and currency (403 INVALID_TERMS). It
// wraps the fenceproof error that says which (ErrMissing, ErrMalformed,
// ErrUnknownKey, ErrInvalid).
var ErrInvalidTerms = errors.New("railproxy: payout terms not signed by payment-resource")

// verifyTerms checks req's TermsSignature against Config.TermsKeys over
// req's own terms. On a refusal it logs EventTermsRefused at WARN (the
// terms, the holder's token and owner, the reason) and returns an error
// wrapping ErrInvalidTerms; it touches neither raildb nor the rail.
func (p *Proxy) verifyTerms(ctx context.Context, req api.SubmitRequest, h payoutevent.Holder) error {
	_, err := p.cfg.TermsKeys.Verify(req.TermsSignature, payoutevent.PayoutTermsDomain, req.Terms().Fields()...)
	if err == nil {
		return nil
	}
	p.log.WarnContext(ctx, "submission refused: payment-resource did not sign these payout terms", "event", api.EventTermsRefused,
		"payoutId", req.PayoutID, "accountId", req.AccountID, "amountMinor", req.AmountMinor, "currency", req.Currency,
		"token", h.Token, "ownerId", h.Owner, "reason", err.Error())
	return fmt.Errorf("%w: %w", ErrInvalidTerms, err)
}
