package fenceproof_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
)

// seeded is a deterministic byte source for key generation in tests.
type seeded struct{ r *rand.ChaCha8 }

func (s seeded) Read(p []byte) (int, error) { return s.r.Read(p) }

func newKey(t testing.TB, id string, seed byte) fenceproof.SigningKey {
	t.Helper()
	k, err := fenceproof.GenerateSigningKey(id, seeded{rand.NewChaCha8([32]byte{seed})})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func ring(t testing.TB, keys ...fenceproof.SigningKey) fenceproof.Keyring {
	t.Helper()
	var vs []fenceproof.VerifyKey
	for _, k := range keys {
		vs = append(vs, k.VerifyKey())
	}
	r, err := fenceproof.NewKeyring(vs...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestGrantProofVerifiesOnlyForItsKeyAndToken(t *testing.T) {
	k := newKey(t, "k1", 1)
	r := ring(t, k)
	at := time.UnixMilli(1_790_000_000_123).UTC()
	proof := k.SignGrant("payout:acct-1", 42, at)

	g, err := r.VerifyGrant(proof, "payout:acct-1", 42)
	if err != nil {
		t.Fatalf("VerifyGrant of a proof just made: %v", err)
	}
	if g.KeyID != "k1" || !g.Issued.Equal(at) {
		t.Fatalf("VerifyGrant = %+v, want key k1 issued %v", g, at)
	}

	other := newKey(t, "k1", 2) // same id, another secret: a forger's key
	for _, c := range []struct {
		name, proof, key string
		token            int64
		want             error
	}{
		{"another lock key", proof, "payout:acct-2", 42, fenceproof.ErrInvalid},
		{"a higher token", proof, "payout:acct-1", 43, fenceproof.ErrInvalid},
		{"the maximum token", proof, "payout:acct-1", 1<<63 - 1, fenceproof.ErrInvalid},
		{"a forger's key with the same id", other.SignGrant("payout:acct-1", 42, at), "payout:acct-1", 42, fenceproof.ErrInvalid},
		{"an altered signing time", strings.Replace(proof, "1790000000123", "1790000000124", 1), "payout:acct-1", 42, fenceproof.ErrInvalid},
		{"a signature of another statement", "v1.1790000000123." + k.Sign("another/domain", "payout:acct-1", "42", "1790000000123"), "payout:acct-1", 42, fenceproof.ErrInvalid},
		{"no proof", "", "payout:acct-1", 42, fenceproof.ErrMissing},
		{"no version", strings.TrimPrefix(proof, "v1."), "payout:acct-1", 42, fenceproof.ErrMalformed},
		{"a signing time with a sign", strings.Replace(proof, ".1790", ".+1790", 1), "payout:acct-1", 42, fenceproof.ErrMalformed},
		{"a cut signature", proof[:len(proof)-4], "payout:acct-1", 42, fenceproof.ErrMalformed},
		{"the signature's last character with its unused bits set", respell(proof), "payout:acct-1", 42, fenceproof.ErrMalformed},
		{"too long", proof + strings.Repeat("A", fenceproof.MaxProofLen), "payout:acct-1", 42, fenceproof.ErrMalformed},
		{"an unknown key id", newKey(t, "k9", 3).SignGrant("payout:acct-1", 42, at), "payout:acct-1", 42, fenceproof.ErrUnknownKey},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := r.VerifyGrant(c.proof, c.key, c.token); !errors.Is(err, c.want) {
				t.Fatalf("VerifyGrant = %v, want %v", err, c.want)
			}
			// CheckGrant, without keys, refuses exactly the proofs of a
			// form no key could verify, as VerifyGrant does.
			err := fenceproof.CheckGrant(c.proof)
			if formOnly := errors.Is(c.want, fenceproof.ErrMissing) || errors.Is(c.want, fenceproof.ErrMalformed); formOnly {
				if !errors.Is(err, c.want) {
					t.Fatalf("CheckGrant = %v, want %v", err, c.want)
				}
			} else if err != nil {
				t.Fatalf("CheckGrant = %v, want nil (only the keys can refuse it)", err)
			}
		})
	}
}

func TestFieldsAreLengthPrefixed(t *testing.T) {
	k := newKey(t, "k1", 1)
	r := ring(t, k)
	sig := k.Sign("d", "ab", "c")
	if _, err := r.Verify(sig, "d", "a", "bc"); !errors.Is(err, fenceproof.ErrInvalid) {
		t.Fatalf("a signature over (ab, c) verified over (a, bc): %v", err)
	}
	if id, err := r.Verify(sig, "d", "ab", "c"); err != nil || id != "k1" {
		t.Fatalf("Verify = %q, %v", id, err)
	}
}

func TestRotationAcceptsEveryKeyOfTheRing(t *testing.T) {
	old, cur := newKey(t, "2026-11", 1), newKey(t, "2026-12", 2)
	r, err := fenceproof.ParseKeyring(" " + old.VerifyKey().String() + " , " + cur.VerifyKey().String())
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []fenceproof.SigningKey{old, cur} {
		if _, err := r.VerifyGrant(k.SignGrant("x", 7, time.Now()), "x", 7); err != nil {
			t.Errorf("key %s: %v", k.ID(), err)
		}
	}
	only, _ := fenceproof.ParseKeyring(cur.VerifyKey().String())
	if _, err := only.VerifyGrant(old.SignGrant("x", 7, time.Now()), "x", 7); !errors.Is(err, fenceproof.ErrUnknownKey) {
		t.Fatalf("a retired key still verifies: %v", err)
	}
}

func TestKeysRoundTripTheirStringForms(t *testing.T) {
	k := newKey(t, "k_1-a", 5)
	back, err := fenceproof.ParseSigningKey(k.String())
	if err != nil {
		t.Fatal(err)
	}
	r := ring(t, k)
	if _, err := r.VerifyGrant(back.SignGrant("x", 1, time.Now()), "x", 1); err != nil {
		t.Fatalf("a parsed signing key signs differently: %v", err)
	}
	seed := strings.SplitN(k.String(), ":", 2)[1][:42] // the seed's 32 bytes
	if strings.Contains(k.VerifyKey().String(), seed) {
		t.Fatal("the public form carries the secret seed")
	}
	raw := []byte(k.String())
	raw[len(raw)-2] ^= 1 // damage the public half
	if _, err := fenceproof.ParseSigningKey(string(raw)); !errors.Is(err, fenceproof.ErrBadKey) {
		t.Fatalf("a signing key with a damaged public half parsed: %v", err)
	}
}

// TestWeakPublicKeysAreRefused: a keyring entry that no honest signer
// has is refused (ErrBadKey): a point of small order, under which
// crypto/ed25519.Verify accepts a signature anyone can make, and bytes
// that encode no curve point. The first check shows why: under the
// identity point, the signature (R = identity, S = 0) verifies for every
// message.
func TestWeakPublicKeysAreRefused(t *testing.T) {
	identity := append([]byte{1}, make([]byte, 31)...)
	forged := append(slices.Clone(identity), make([]byte, 32)...)
	if !ed25519.Verify(identity, []byte("grant payout:acct-1 token 99"), forged) {
		t.Fatal("the forged signature did not verify under the identity point; this test's reason to exist may be gone")
	}
	for name, b64 := range map[string]string{
		"identity":          base64.RawURLEncoding.EncodeToString(identity),
		"order 8":           "xxdqcD1N2E-6PAt2DRBnDyogU_osOczGTsf9d5KsA3o",
		"not a point (y=2)": "AgAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
	} {
		if _, err := fenceproof.ParseKeyring("weak:" + b64); !errors.Is(err, fenceproof.ErrBadKey) {
			t.Errorf("ParseKeyring of a %s key = %v, want ErrBadKey", name, err)
		}
	}
	good := newKey(t, "k1", 1)
	if _, err := fenceproof.ParseKeyring(good.VerifyKey().String()); err != nil {
		t.Errorf("a generated key was refused: %v", err)
	}
}

func TestBadKeysAreRefused(t *testing.T) {
	good := newKey(t, "k1", 1)
	pub := good.VerifyKey().String()
	for _, s := range []string{"", "k1", "k1:", ":" + strings.SplitN(pub, ":", 2)[1], "k 1:" + strings.SplitN(pub, ":", 2)[1],
		strings.Repeat("k", fenceproof.MaxKeyIDLen+1) + ":" + strings.SplitN(pub, ":", 2)[1], "k1:!!!", pub + "AA", pub + "," + pub, " , "} {
		if _, err := fenceproof.ParseKeyring(s); !errors.Is(err, fenceproof.ErrBadKey) {
			t.Errorf("ParseKeyring(%q) = %v, want ErrBadKey", s, err)
		}
	}
	if _, err := fenceproof.ParseSigningKey(pub); !errors.Is(err, fenceproof.ErrBadKey) {
		t.Errorf("a public key parsed as a signing key: %v", err)
	}
	if _, err := fenceproof.GenerateSigningKey("", nil); !errors.Is(err, fenceproof.ErrBadKey) {
		t.Errorf("GenerateSigningKey with no id: %v", err)
	}
	var zero fenceproof.Keyring
	if _, err := zero.VerifyGrant(good.SignGrant("x", 1, time.Now()), "x", 1); !errors.Is(err, fenceproof.ErrUnknownKey) {
		t.Errorf("the zero Keyring verified a proof: %v", err)
	}
}

// The cost lock-server pays per grant (a fence point's is BenchmarkVerify).
func BenchmarkSignGrant(b *testing.B) {
	k := newKey(b, "k1", 1)
	at := time.Now()
	for b.Loop() {
		k.SignGrant("payout:acct-1", 42, at)
	}
}

// respell returns proof with the last base64url character of its
// signature replaced by one that carries the same data bits and sets the
// unused ones: the same bytes to a lenient decoder, another text.
func respell(proof string) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, proof[len(proof)-1])
	return proof[:len(proof)-1] + string(alphabet[i|0x0f])
}
