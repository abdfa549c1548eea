package fenceproof_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
)

// isOneOf reports whether err wraps one of targets.
func isOneOf(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// FuzzVerifyGrant checks a Keyring against arbitrary proofs, lock keys and
// tokens: every refusal wraps one of the documented errors; an accepted
// proof is bound to exactly its key and token (it fails for a neighbour
// of either) and names the ring's key; a proof the ring's key signed for
// the same key and token always verifies; and the ring, whose cache
// remembers every success of the run, answers exactly as a ring without a
// cache.
func FuzzVerifyGrant(f *testing.F) {
	k := newKey(f, "fuzz-key", 7)
	other := newKey(f, "fuzz-key", 8) // same id, another key: a forgery
	ring, err := fenceproof.NewKeyring(k.VerifyKey())
	if err != nil {
		f.Fatal(err)
	}
	uncached, err := fenceproof.NewKeyringWithCache(0, k.VerifyKey())
	if err != nil {
		f.Fatal(err)
	}
	issued := time.Unix(1_790_000_000, 0)
	f.Add(k.SignGrant("payout:acct-1", 5, issued), "payout:acct-1", int64(5))
	f.Add(k.SignGrant("payout:acct-1", 5, issued), "payout:acct-2", int64(5))
	f.Add(k.SignGrant("payout:acct-1", 5, issued), "payout:acct-1", int64(6))
	f.Add(other.SignGrant("payout:acct-1", 5, issued), "payout:acct-1", int64(5))
	f.Add("", "payout:acct-1", int64(1))
	f.Add("v1.", "k", int64(1))
	f.Add("v1.-1.fuzz-key.AAAA", "k", int64(1))
	f.Add("v1.01.fuzz-key.AAAA", "k", int64(1))
	f.Add("v2.1.fuzz-key."+strings.Repeat("A", 86), "k", int64(1))
	f.Add("v1.1.unknown."+strings.Repeat("A", 86), "k", int64(1))
	f.Add("v1.1.fuzz-key."+strings.Repeat("A", 86), "k", int64(-1))
	f.Add(strings.Repeat("v1.", 100), "k", int64(9223372036854775807))
	f.Fuzz(func(t *testing.T, proof, key string, token int64) {
		g, err := ring.VerifyGrant(proof, key, token)
		if ug, uerr := uncached.VerifyGrant(proof, key, token); ug != g || fmt.Sprint(uerr) != fmt.Sprint(err) {
			t.Fatalf("VerifyGrant(%q, %q, %d) = %+v, %v; without a cache %+v, %v", proof, key, token, g, err, ug, uerr)
		}
		if err != nil {
			if !isOneOf(err, fenceproof.ErrMissing, fenceproof.ErrMalformed, fenceproof.ErrUnknownKey, fenceproof.ErrInvalid) {
				t.Fatalf("VerifyGrant(%q, %q, %d) = %v; want one of the documented errors", proof, key, token, err)
			}
		} else {
			if g.KeyID != k.ID() {
				t.Fatalf("VerifyGrant(%q) accepted under key %q", proof, g.KeyID)
			}
			if _, err := ring.VerifyGrant(proof, key+"x", token); !errors.Is(err, fenceproof.ErrInvalid) {
				t.Fatalf("proof %q of %q also verifies for key %q: %v", proof, key, key+"x", err)
			}
			if _, err := ring.VerifyGrant(proof, key, token^1); !errors.Is(err, fenceproof.ErrInvalid) {
				t.Fatalf("proof %q of token %d also verifies for token %d: %v", proof, token, token^1, err)
			}
		}
		genuine := k.SignGrant(key, token, issued)
		if _, err := ring.VerifyGrant(genuine, key, token); err != nil && len(genuine) <= fenceproof.MaxProofLen {
			t.Fatalf("a genuine proof of (%q, %d) is refused: %v", key, token, err)
		}
		if _, err := ring.VerifyGrant(other.SignGrant(key, token, issued), key, token); err == nil {
			t.Fatalf("a proof by another key with the same id verifies for (%q, %d)", key, token)
		}
	})
}

// FuzzParseKeys reads arbitrary strings as a signing key and as a keyring:
// a refusal wraps ErrBadKey and never repeats the secret part of the
// string; an accepted signing key prints back to a string that parses to
// the same key, and what it signs verifies with its public half; an
// accepted keyring holds at least one key.
func FuzzParseKeys(f *testing.F) {
	k := newKey(f, "fuzz-key", 7)
	k2 := newKey(f, "rotated", 9)
	f.Add(k.String())
	f.Add(k.VerifyKey().String())
	f.Add(k.VerifyKey().String() + ", " + k2.VerifyKey().String())
	f.Add(k.VerifyKey().String() + "," + k.VerifyKey().String())
	f.Add(" , ,")
	f.Add("id-only")
	f.Add("bad id:" + strings.Repeat("A", 43))
	f.Add(strings.Repeat("x", 40) + ":" + strings.Repeat("A", 43))
	f.Add("k:" + strings.Repeat("A", 86))
	f.Add("k:" + strings.Repeat("A", 42) + "=")
	f.Add(k.String()[:len(k.String())-1] + "B")
	f.Fuzz(func(t *testing.T, s string) {
		id, secret, _ := strings.Cut(strings.TrimSpace(s), ":")
		sk, err := fenceproof.ParseSigningKey(s)
		if err != nil {
			if !errors.Is(err, fenceproof.ErrBadKey) {
				t.Fatalf("ParseSigningKey(%q) = %v; want ErrBadKey", s, err)
			}
			if len(secret) >= 16 && !strings.Contains(id, secret) && strings.Contains(err.Error(), secret) {
				t.Fatalf("ParseSigningKey's error repeats the secret: %v", err)
			}
		} else {
			again, err := fenceproof.ParseSigningKey(sk.String())
			if err != nil || again.String() != sk.String() || again.ID() != sk.ID() {
				t.Fatalf("ParseSigningKey(%q) = %q, which reads back as %q, %v", s, sk.String(), again.String(), err)
			}
			ring, err := fenceproof.ParseKeyring(sk.VerifyKey().String())
			if err != nil {
				t.Fatalf("the public half %q of an accepted key does not parse: %v", sk.VerifyKey().String(), err)
			}
			if _, err := ring.VerifyGrant(sk.SignGrant("k", 1, time.Unix(0, 0)), "k", 1); err != nil {
				t.Fatalf("key %q: its own proof does not verify: %v", sk.ID(), err)
			}
		}
		ring, err := fenceproof.ParseKeyring(s)
		if err != nil {
			if !errors.Is(err, fenceproof.ErrBadKey) {
				t.Fatalf("ParseKeyring(%q) = %v; want ErrBadKey", s, err)
			}
			return
		}
		if ring.Len() == 0 || len(ring.IDs()) != ring.Len() {
			t.Fatalf("ParseKeyring(%q) accepted a ring of %d keys, ids %v", s, ring.Len(), ring.IDs())
		}
	})
}
