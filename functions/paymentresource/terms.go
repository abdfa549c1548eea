package paymentresource

import (
	"net/http"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
)

// Signed payout terms. A lease on an account's
// lock lets its holder send a submission to rail-proxy; without more,
// rail-proxy would forward any payout id, amount, currency or account the
// holder wrote, and only the reconciler's audit would notice the money
// later. payment-resource therefore signs the terms of every payout it
// answers (fencewire.PayoutTerms: payout id, account, amount in minor
// units, currency), and rail-proxy forwards only terms it signed.
//
// The signature is made from paydb's row each time a payout is answered,
// not stored: the terms never change after creation (a create that
// differs is refused), Ed25519 signatures are deterministic, and a
// rotated key signs every payout from then on without a migration. The
// creation path is untouched: a payout that paydb holds is signed, and
// one it does not hold never is.

// terms returns p's terms as signed.
func terms(p api.Payout) fencewire.PayoutTerms {
	return fencewire.PayoutTerms{PayoutID: p.PayoutID, AccountID: p.AccountID, AmountMinor: p.AmountMinor, Currency: p.Currency}
}

// signTerms sets p.TermsSignature: the terms key's signature over p's
// terms under fencewire.PayoutTermsDomain.
func (s *Service) signTerms(p *api.Payout) {
	p.TermsSignature = s.termsKey.Sign(fencewire.PayoutTermsDomain, terms(*p).Fields()...)
}

// writePayout answers p with status, its terms signed.
func (s *Service) writePayout(w http.ResponseWriter, status int, p api.Payout) {
	s.signTerms(&p)
	jsonhandler.WriteJSON(w, status, p)
}

// writePayouts answers a page of payouts (200), each with its terms
// signed.
func (s *Service) writePayouts(w http.ResponseWriter, list api.PayoutList) {
	for i := range list.Payouts {
		s.signTerms(&list.Payouts[i])
	}
	jsonhandler.WriteJSON(w, http.StatusOK, list)
}
