package fenceproof_test

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
)

// cachedRing is a Keyring of keys remembering up to size verifications.
func cachedRing(t testing.TB, size int, keys ...fenceproof.SigningKey) fenceproof.Keyring {
	t.Helper()
	var vs []fenceproof.VerifyKey
	for _, k := range keys {
		vs = append(vs, k.VerifyKey())
	}
	r, err := fenceproof.NewKeyringWithCache(size, vs...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// resign returns sig ("<key id>.<signature>") presented under key id.
func resign(sig, id string) string {
	_, b64, _ := strings.Cut(sig, ".")
	return id + "." + b64
}

// flip returns sig with one bit of its signature's first byte flipped:
// well-formed, and another signature.
func flip(t *testing.T, sig string) string {
	t.Helper()
	id, b64, _ := strings.Cut(sig, ".")
	raw, err := base64.RawURLEncoding.DecodeString(b64)
	if err != nil {
		t.Fatal(err)
	}
	raw[0] ^= 1
	return id + "." + base64.RawURLEncoding.EncodeToString(raw)
}

// TestCachedSuccessAcceptsNothingElse: once a signature has verified (and
// is remembered), the cache answers for exactly that key, message and
// signature; every neighbour gets the full check and its own refusal.
func TestCachedSuccessAcceptsNothingElse(t *testing.T) {
	k1, k2 := newKey(t, "k1", 1), newKey(t, "k2", 2)
	r := ring(t, k1, k2) // NewKeyring: the production cache
	sig := k1.Sign("d", "payout:acct-1", "42")
	for i := range 2 {
		if id, err := r.Verify(sig, "d", "payout:acct-1", "42"); err != nil || id != "k1" {
			t.Fatalf("verification %d of a genuine signature = %q, %v; want k1, nil", i+1, id, err)
		}
	}
	if n := fenceproof.Remembered(r); n != 1 {
		t.Fatalf("the ring remembers %d verifications after one genuine signature; want 1", n)
	}
	for _, c := range []struct {
		name, sig, domain, token string
		want                     error
	}{
		{"a different message", sig, "d", "43", fenceproof.ErrInvalid},
		{"a different domain", sig, "other", "42", fenceproof.ErrInvalid},
		{"a different signature", flip(t, sig), "d", "42", fenceproof.ErrInvalid},
		{"another key's signature under k1's id", resign(k2.Sign("d", "payout:acct-1", "42"), "k1"), "d", "42", fenceproof.ErrInvalid},
		{"the same signature under another key of the ring", resign(sig, "k2"), "d", "42", fenceproof.ErrInvalid},
		{"the same signature under an unknown key id", resign(sig, "k9"), "d", "42", fenceproof.ErrUnknownKey},
	} {
		t.Run(c.name, func(t *testing.T) {
			if id, err := r.Verify(c.sig, c.domain, "payout:acct-1", c.token); !errors.Is(err, c.want) {
				t.Fatalf("Verify = %q, %v; want %v", id, err, c.want)
			}
		})
	}
	if n := fenceproof.Remembered(r); n != 1 {
		t.Fatalf("the ring remembers %d verifications after refusals; want 1 (only successes)", n)
	}
}

// TestRetiredKeyIsRefusedAfterACachedSuccess: a rotation that removes a
// key, or gives its id to another key, ends what that key verified, even
// a proof verified (and remembered) a moment before.
func TestRetiredKeyIsRefusedAfterACachedSuccess(t *testing.T) {
	old, cur := newKey(t, "2026-11", 1), newKey(t, "2026-12", 2)
	both := ring(t, old, cur)
	proof := old.SignGrant("payout:acct-1", 7, time.UnixMilli(1_790_000_000_000))
	for range 2 {
		if _, err := both.VerifyGrant(proof, "payout:acct-1", 7); err != nil {
			t.Fatalf("a proof of a key in the ring: %v", err)
		}
	}
	if n := fenceproof.Remembered(both); n != 1 {
		t.Fatalf("the ring remembers %d verifications; want 1", n)
	}
	retired := ring(t, cur)
	if _, err := retired.VerifyGrant(proof, "payout:acct-1", 7); !errors.Is(err, fenceproof.ErrUnknownKey) {
		t.Fatalf("a retired key's proof, verified before the rotation: %v; want ErrUnknownKey", err)
	}
	reused := ring(t, newKey(t, "2026-11", 3), cur) // the old id, another key
	if _, err := reused.VerifyGrant(proof, "payout:acct-1", 7); !errors.Is(err, fenceproof.ErrInvalid) {
		t.Fatalf("a proof of a key whose id now names another key: %v; want ErrInvalid", err)
	}
	// The copy of the ring kept from before the rotation is unchanged, and
	// still verifies it: a Keyring's keys never change.
	if _, err := both.VerifyGrant(proof, "payout:acct-1", 7); err != nil {
		t.Fatalf("the ring from before the rotation: %v", err)
	}
}

// TestVerifyCacheIsBounded: a ring remembers at most its cache size, and a
// proof that fell out of the cache verifies again (the full check).
func TestVerifyCacheIsBounded(t *testing.T) {
	k := newKey(t, "k1", 1)
	r := cachedRing(t, 2, k)
	at := time.UnixMilli(1_790_000_000_000)
	for round := range 2 {
		for tok := int64(1); tok <= 5; tok++ {
			if _, err := r.VerifyGrant(k.SignGrant("x", tok, at), "x", tok); err != nil {
				t.Fatalf("round %d, token %d: %v", round, tok, err)
			}
			if n := fenceproof.Remembered(r); n > 2 {
				t.Fatalf("a ring with a cache of 2 remembers %d verifications", n)
			}
		}
	}
	if n := fenceproof.Remembered(cachedRing(t, 0, k)); n != 0 {
		t.Fatalf("a ring without a cache remembers %d", n)
	}
}

// TestVerifyCacheIsSafeForConcurrentUse runs verifications of genuine and
// altered proofs from several goroutines on one ring (run with -race):
// every answer is the uncached one.
func TestVerifyCacheIsSafeForConcurrentUse(t *testing.T) {
	k := newKey(t, "k1", 1)
	r := cachedRing(t, 8, k) // smaller than the proofs: evictions too
	at := time.UnixMilli(1_790_000_000_000)
	proofs := make([]string, 16)
	for i := range proofs {
		proofs[i] = k.SignGrant(fmt.Sprint("payout:acct-", i), int64(i+1), at)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4*len(proofs))
	for g := range 4 {
		wg.Go(func() {
			for i := range proofs {
				i := (i + g*5) % len(proofs)
				key := fmt.Sprint("payout:acct-", i)
				if _, err := r.VerifyGrant(proofs[i], key, int64(i+1)); err != nil {
					errs <- fmt.Errorf("genuine proof %d: %v", i, err)
				}
				if _, err := r.VerifyGrant(proofs[i], key, int64(i+2)); !errors.Is(err, fenceproof.ErrInvalid) {
					errs <- fmt.Errorf("proof %d with another token: %v; want ErrInvalid", i, err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// BenchmarkVerify is what a fence point pays for a grant proof: without a
// cache (the bare Ed25519 check), with a cache that misses every time (the
// check plus the digest and the cache's bookkeeping: a proof seen once),
// and with a cache that hits (a proof seen again: the claim's proof at
// the result).
func BenchmarkVerify(b *testing.B) {
	k := newKey(b, "k1", 1)
	at := time.UnixMilli(1_790_000_000_000)
	const distinct = 2 * fenceproof.VerifyCacheSize // cycled: never a hit
	proofs := make([]string, distinct)
	for i := range proofs {
		proofs[i] = k.SignGrant("payout:acct-1", int64(i+1), at)
	}
	for _, c := range []struct {
		name   string
		size   int
		proofs int
	}{
		{"cache=none", 0, 1},
		{"cache=miss", fenceproof.VerifyCacheSize, distinct},
		{"cache=hit", fenceproof.VerifyCacheSize, 1},
	} {
		b.Run(c.name, func(b *testing.B) {
			r := cachedRing(b, c.size, k)
			i := 0
			for b.Loop() {
				if _, err := r.VerifyGrant(proofs[i], "payout:acct-1", int64(i+1)); err != nil {
					b.Fatal(err)
				}
				if i++; i == c.proofs {
					i = 0
				}
			}
		})
	}
}
