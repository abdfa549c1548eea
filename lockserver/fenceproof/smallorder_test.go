package fenceproof_test

import (
	"encoding/base64"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
)

// TestEverySmallOrderEncodingIsRefused: all eight points of small order
// (orders 1, 2, 4 and 8), in every encoding a decoder may accept: the
// canonical ones, y >= p (y = p and p+1 stand for 0 and 1), and the sign
// bit set on x = 0 ("negative zero"). Each is refused with ErrBadKey;
// the y values are those of libsodium's blocklist.
func TestEverySmallOrderEncodingIsRefused(t *testing.T) {
	ys := map[string]string{
		"y=0 (order 4)":       "0000000000000000000000000000000000000000000000000000000000000000",
		"y=1 (identity)":      "0100000000000000000000000000000000000000000000000000000000000000",
		"y=p-1 (order 2)":     "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
		"y=p (0, order 4)":    "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
		"y=p+1 (1, identity)": "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
		"order 8, first y":    "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
		"order 8, second y":   "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
	}
	for name, h := range ys {
		raw, err := hex.DecodeString(h)
		if err != nil {
			t.Fatal(err)
		}
		for _, sign := range []byte{0, 0x80} {
			b := append([]byte(nil), raw...)
			b[31] |= sign
			if _, err := fenceproof.ParseKeyring("weak:" + base64.RawURLEncoding.EncodeToString(b)); !errors.Is(err, fenceproof.ErrBadKey) {
				t.Errorf("ParseKeyring of %s, sign bit %#x = %v, want ErrBadKey", name, sign, err)
			}
		}
	}
}

// TestEveryGeneratedKeyParses: honest keys (seeded, many) are never
// taken for weak ones.
func TestEveryGeneratedKeyParses(t *testing.T) {
	rng := rand.NewChaCha8([32]byte{7})
	for i := range 2000 {
		k, err := fenceproof.GenerateSigningKey("k", rng)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fenceproof.ParseKeyring(k.VerifyKey().String()); err != nil {
			t.Fatalf("generated key %d refused: %v", i, err)
		}
	}
}
