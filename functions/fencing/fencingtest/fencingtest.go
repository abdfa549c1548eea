// Package fencingtest gives tests the keys of a test deployment: lock-server's
// grant-proof key, rail-proxy's receipt key and payment-resource's
// payout-terms key, all made from fixed
// seeds (test keys, never for a real deployment), and helpers that sign
// what those services would sign, so a test can present a verified token
// to a fence point without running lock-server.
package fencingtest

import (
	"math/rand/v2"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
)

type chacha struct{ r *rand.ChaCha8 }

func (c chacha) Read(p []byte) (int, error) { return c.r.Read(p) }

func key(id string, seed byte) fenceproof.SigningKey {
	k, err := fenceproof.GenerateSigningKey(id, chacha{rand.NewChaCha8([32]byte{seed})})
	if err != nil {
		panic(err) // fixed, valid id
	}
	return k
}

func ring(k fenceproof.SigningKey) fenceproof.Keyring {
	r, err := fenceproof.NewKeyring(k.VerifyKey())
	if err != nil {
		panic(err)
	}
	return r
}

var (
	lockKey    = key("test-lock", 1)
	receiptKey = key("test-rail", 2)
	termsKey   = key("test-pay", 3)
)

// LockSigningKey is lock-server's grant-proof key in tests.
func LockSigningKey() fenceproof.SigningKey { return lockKey }

// ProofKeys is the fence points' keyring for LockSigningKey.
func ProofKeys() fenceproof.Keyring { return ring(lockKey) }

// ReceiptSigningKey is rail-proxy's receipt key in tests.
func ReceiptSigningKey() fenceproof.SigningKey { return receiptKey }

// ReceiptKeys is payment-resource's keyring for ReceiptSigningKey.
func ReceiptKeys() fenceproof.Keyring { return ring(receiptKey) }

// TermsSigningKey is payment-resource's payout-terms key in tests.
func TermsSigningKey() fenceproof.SigningKey { return termsKey }

// TermsKeys is rail-proxy's keyring for TermsSigningKey.
func TermsKeys() fenceproof.Keyring { return ring(termsKey) }

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
	return lockKey.SignGrant(payoutevent.Event{AccountID: account}.LockKey(), token, time.Unix(1_790_000_000, 0))
}

// Receipt is ReceiptSigningKey's receipt over r, as rail-proxy signs it.
func Receipt(r fencewire.RailReceipt) string {
	return receiptKey.Sign(fencewire.RailReceiptDomain, r.Fields()...)
}

// Env returns the environment lines ("NAME=value") that give a stack's
// processes these keys: lock-server's signing key, both fence points'
// proof keys, rail-proxy's receipt key and payment-resource's receipt keys,
// payment-resource's terms key and rail-proxy's terms keys.
func Env(lockSigningVar string) []string {
	return []string{
		lockSigningVar + "=" + lockKey.String(),
		fencewire.EnvProofKeys + "=" + lockKey.VerifyKey().String(),
		fencewire.EnvReceiptSigningKey + "=" + receiptKey.String(),
		fencewire.EnvReceiptKeys + "=" + receiptKey.VerifyKey().String(),
		fencewire.EnvTermsSigningKey + "=" + termsKey.String(),
		fencewire.EnvTermsKeys + "=" + termsKey.VerifyKey().String(),
	}
}
