package fenceproof_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
)

// TestCachedRingAnswersAsTheUncachedOne: a long seeded sequence of
// verifications on one small cached ring (evictions included) and on a
// ring without a cache, with the same keys: genuine proofs, the same
// proofs checked against another lock key, token or signer, proofs
// presented under the other key's id, replays of all of these, and
// proofs of a key the rings do not hold. Every answer of the cached ring
// is the uncached ring's, error for error; a cache entry that bound less
// than the public key, the whole message and the signature would answer
// a neighbour from a remembered success.
func TestCachedRingAnswersAsTheUncachedOne(t *testing.T) {
	a, b, stranger := newKey(t, "k-a", 11), newKey(t, "k-b", 12), newKey(t, "k-a", 13) // stranger reuses a's id
	cached := cachedRing(t, 16, a, b)
	plain := cachedRing(t, 0, a, b)
	rnd := rand.New(rand.NewPCG(7, 8))
	at := time.UnixMilli(1_790_000_000_000)
	signers := []fenceproof.SigningKey{a, b, stranger}
	var seen []string // proofs presented earlier, for replays
	for i := range 4000 {
		key := fmt.Sprint("payout:acct-", rnd.IntN(6))
		token := int64(1 + rnd.IntN(6))
		var proof string
		switch r := rnd.IntN(4); {
		case len(seen) > 0 && r == 0:
			proof = seen[rnd.IntN(len(seen))]
		case len(seen) > 0 && r == 1:
			// An earlier proof presented under the other key's id.
			parts := strings.SplitN(seen[rnd.IntN(len(seen))], ".", 4)
			parts[2] = map[string]string{"k-a": "k-b", "k-b": "k-a"}[parts[2]]
			proof = strings.Join(parts, ".")
		default:
			s := signers[rnd.IntN(len(signers))]
			proof = s.SignGrant(fmt.Sprint("payout:acct-", rnd.IntN(6)), int64(1+rnd.IntN(6)), at)
			seen = append(seen, proof)
		}
		_, gotErr := cached.VerifyGrant(proof, key, token)
		_, wantErr := plain.VerifyGrant(proof, key, token)
		same := (gotErr == nil) == (wantErr == nil)
		for _, sentinel := range []error{fenceproof.ErrMissing, fenceproof.ErrMalformed, fenceproof.ErrUnknownKey, fenceproof.ErrInvalid} {
			same = same && errors.Is(gotErr, sentinel) == errors.Is(wantErr, sentinel)
		}
		if !same {
			t.Fatalf("step %d: VerifyGrant(%q, %s, %d) = %v with the cache, %v without", i, proof, key, token, gotErr, wantErr)
		}
	}
	if fenceproof.Remembered(cached) == 0 {
		t.Fatal("the cached ring remembered nothing: the sequence never hit a genuine proof")
	}
}
