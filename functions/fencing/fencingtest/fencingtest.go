// Package fencingtest gives tests the keys of a test deployment's fence
// points (rail-proxy's receipt key, payment-resource's payout-terms key;
// lock-server's is fenceprooftest's) and signs what those services sign,
// so that a test can present a verified token, receipt or terms to a fence
// point without running lock-server. Test keys, never for a real
// deployment.
package fencingtest

import (
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof/fenceprooftest"
)

var (
	receiptKey = fenceprooftest.Key("test-rail", 2)
	termsKey   = fenceprooftest.Key("test-pay", 3)
)

// LockSigningKey is lock-server's grant-proof key in tests
// (fenceprooftest.LockSigningKey).
func LockSigningKey() fenceproof.SigningKey { return fenceprooftest.LockSigningKey() }

// ProofKeys is the fence points' keyring for LockSigningKey.
func ProofKeys() fenceproof.Keyring { return fenceprooftest.ProofKeys() }

// ReceiptSigningKey is rail-proxy's receipt key in tests.
func ReceiptSigningKey() fenceproof.SigningKey { return receiptKey }

// ReceiptKeys is payment-resource's keyring for ReceiptSigningKey.
func ReceiptKeys() fenceproof.Keyring { return fenceprooftest.Ring(receiptKey) }

// TermsSigningKey is payment-resource's payout-terms key in tests.
func TermsSigningKey() fenceproof.SigningKey { return termsKey }

// TermsKeys is rail-proxy's keyring for TermsSigningKey.
func TermsKeys() fenceproof.Keyring { return fenceprooftest.Ring(termsKey) }

// Terms is TermsSigningKey's signature over t, as payment-resource signs
// a payout's terms (api.Payout.TermsSignature).
func Terms(t fencewire.PayoutTerms) string {
	return termsKey.Sign(fencewire.PayoutTermsDomain, t.Fields()...)
}

// Holder returns the headers a holder of token on account's lock
// (payout:{account}) sends, with a proof signed by LockSigningKey.
func Holder(account string, token int64, owner string) fencewire.Holder {
	return fencewire.Holder{Token: token, Owner: owner, Proof: Proof(account, token)}
}

// Proof is LockSigningKey's proof of token on account's lock.
func Proof(account string, token int64) string {
	return LockSigningKey().SignGrant(payoutevent.Event{AccountID: account}.LockKey(), token, time.Unix(1_790_000_000, 0))
}

// Receipt is ReceiptSigningKey's receipt over r, as rail-proxy signs it.
func Receipt(r fencewire.RailReceipt) string {
	return receiptKey.Sign(fencewire.RailReceiptDomain, r.Fields()...)
}
