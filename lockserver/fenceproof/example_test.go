package fenceproof_test

import (
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
)

// A fence point verifies the proof that came with a fencing token, for the
// lock key that guards the resource it protects, before it lets the token
// raise its high-water mark.
func Example() {
	// lock-server holds the signing key; fence points get its public half.
	signing, _ := fenceproof.GenerateSigningKey("2026-12", rand.Reader)
	keys, _ := fenceproof.ParseKeyring(signing.VerifyKey().String())

	// lock-server signs each grant (lockserver/api Grant.Proof).
	proof := signing.SignGrant("payout:acct-1", 42, time.Now())

	// The fence point of acct-1 checks the holder's token and proof.
	_, err := keys.VerifyGrant(proof, "payout:acct-1", 42)
	fmt.Println("token 42 for acct-1:", err)

	// The same proof cannot carry a higher token, or another account's.
	_, err = keys.VerifyGrant(proof, "payout:acct-1", 1<<62)
	fmt.Println("token 2^62:", errors.Is(err, fenceproof.ErrInvalid))
	_, err = keys.VerifyGrant(proof, "payout:acct-2", 42)
	fmt.Println("token 42 for acct-2:", errors.Is(err, fenceproof.ErrInvalid))
	// Output:
	// token 42 for acct-1: <nil>
	// token 2^62: true
	// token 42 for acct-2: true
}
