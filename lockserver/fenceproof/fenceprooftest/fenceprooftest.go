// Package fenceprooftest gives tests lock-server's grant-proof key of a
// test deployment, made from a fixed seed (a test key, never for a real
// deployment), and the fence points' keyring for it.
package fenceprooftest

import (
	"math/rand/v2"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
)

type chacha struct{ r *rand.ChaCha8 }

func (c chacha) Read(p []byte) (int, error) { return c.r.Read(p) }

// Key returns the signing key id made from seed, the same for the same
// arguments.
func Key(id string, seed byte) fenceproof.SigningKey {
	k, err := fenceproof.GenerateSigningKey(id, chacha{rand.NewChaCha8([32]byte{seed})})
	if err != nil {
		panic(err) // a test's fixed id
	}
	return k
}

// Ring returns the keyring that verifies k's signatures.
func Ring(k fenceproof.SigningKey) fenceproof.Keyring {
	r, err := fenceproof.NewKeyring(k.VerifyKey())
	if err != nil {
		panic(err)
	}
	return r
}

var lockKey = Key("test-lock", 1)

// LockSigningKey is lock-server's grant-proof key in tests.
func LockSigningKey() fenceproof.SigningKey { return lockKey }

// ProofKeys is the fence points' keyring for LockSigningKey.
func ProofKeys() fenceproof.Keyring { return Ring(lockKey) }
