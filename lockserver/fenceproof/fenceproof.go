// Package fenceproof lets a fence point check that a fencing token was
// issued by the lock service for the lock that guards its resource.
//
// lock-server signs each grant with a SigningKey (SignGrant: Ed25519 over
// the lock key, the token and the signing time); a fence point holds only
// the public keys, as a Keyring (ParseKeyring), and calls VerifyGrant with
// the lock key that guards its resource before the token may raise its
// high-water mark. A proof says the token was issued, not that the lease is
// live (the high-water mark's job), nor who presents it. Sign and Verify
// sign other statements under a domain of their own (rail-proxy's
// receipts). Design, key rotation and limits: SECURITY.md and
// docs/configuration.md.
package fenceproof

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"filippo.io/edwards25519"
	lru "github.com/hashicorp/golang-lru/v2"
)

// Errors of this package. Verify's errors wrap ErrMissing, ErrMalformed,
// ErrUnknownKey or ErrInvalid; key parsing errors wrap ErrBadKey.
var (
	// ErrMissing: no proof or signature was presented.
	ErrMissing = errors.New("fenceproof: missing proof")
	// ErrMalformed: the proof is not in the v1 format.
	ErrMalformed = errors.New("fenceproof: malformed proof")
	// ErrUnknownKey: the proof names a key id the Keyring does not hold.
	ErrUnknownKey = errors.New("fenceproof: proof signed by an unknown key")
	// ErrInvalid: the signature does not cover what it is checked against:
	// another lock key, another token, altered fields, or a forgery.
	ErrInvalid = errors.New("fenceproof: proof does not match")
	// ErrBadKey: a key string is not "id:base64url" of the right length.
	ErrBadKey = errors.New("fenceproof: bad key")
)

// MaxKeyIDLen is the longest key id, in bytes. Ids are 1..MaxKeyIDLen
// characters from [A-Za-z0-9_-].
const MaxKeyIDLen = 32

// MaxProofLen bounds a proof string in bytes; a longer one is ErrMalformed
// before any decoding. A v1 proof is about 120 bytes.
const MaxProofLen = 256

// Domain of the grant proofs: what Proof signs, so that a signature made
// for another statement can never pass as a grant proof.
const grantDomain = "distributed-lock-lab/fencing-proof/v1"

const version = "v1"

// SigningKey signs proofs. Only lock-server (and, for its own statements,
// rail-proxy) holds one. Its String form, "id:" + the base64url (no
// padding) 64-byte Ed25519 private key, is a secret.
type SigningKey struct {
	id   string
	priv ed25519.PrivateKey
}

// VerifyKey is the public half of a SigningKey. Its String form is "id:"
// + the base64url (no padding) 32-byte Ed25519 public key; it is not a
// secret.
type VerifyKey struct {
	id  string
	pub ed25519.PublicKey
}

// GenerateSigningKey makes a new key called id from rand (crypto/rand.Reader
// in production). It returns ErrBadKey for an invalid id.
func GenerateSigningKey(id string, rand io.Reader) (SigningKey, error) {
	if err := checkID(id); err != nil {
		return SigningKey{}, err
	}
	_, priv, err := ed25519.GenerateKey(rand)
	if err != nil {
		return SigningKey{}, fmt.Errorf("fenceproof: generate key: %w", err)
	}
	return SigningKey{id: id, priv: priv}, nil
}

// ParseSigningKey reads a SigningKey from its String form. It returns
// ErrBadKey (wrapped, with the reason) otherwise.
func ParseSigningKey(s string) (SigningKey, error) {
	id, raw, err := splitKey(s, ed25519.PrivateKeySize)
	if err != nil {
		return SigningKey{}, err
	}
	priv := ed25519.NewKeyFromSeed(raw[:ed25519.SeedSize])
	if !priv.Equal(ed25519.PrivateKey(raw)) {
		return SigningKey{}, fmt.Errorf("%w: key %q: its public half does not match its seed", ErrBadKey, id)
	}
	return SigningKey{id: id, priv: priv}, nil
}

// ID returns the key's id.
func (k SigningKey) ID() string { return k.id }

// IsZero reports whether k is the zero SigningKey (no key configured).
func (k SigningKey) IsZero() bool { return k.priv == nil }

// String returns the secret form ParseSigningKey reads.
func (k SigningKey) String() string {
	if k.IsZero() {
		return ""
	}
	return k.id + ":" + base64.RawURLEncoding.EncodeToString(k.priv)
}

// VerifyKey returns the public half of k.
func (k SigningKey) VerifyKey() VerifyKey {
	return VerifyKey{id: k.id, pub: k.priv.Public().(ed25519.PublicKey)}
}

// ID returns the key's id.
func (k VerifyKey) ID() string { return k.id }

// String returns the form ParseKeyring reads.
func (k VerifyKey) String() string {
	return k.id + ":" + base64.RawURLEncoding.EncodeToString(k.pub)
}

// VerifyCacheSize is how many successful verifications a Keyring made by
// NewKeyring or ParseKeyring remembers (least recently used first out),
// about 180 bytes each. A remembered fact is "this public key signed this
// message with this signature"; the key id is always looked up in the
// Keyring first, so a key removed from it verifies nothing.
const VerifyCacheSize = 4096

// Keyring is the set of public keys a verifier accepts, by id. The zero
// Keyring holds no key and verifies nothing. A Keyring is safe for
// concurrent use; its copies share one cache of successful verifications
// (VerifyCacheSize), and its keys never change: a rotation builds a new
// Keyring, which starts with an empty cache.
type Keyring struct {
	keys map[string]ed25519.PublicKey
	// verified holds the digests (verifyDigest) of the (public key,
	// message, signature) triples ed25519.Verify accepted; nil: none are
	// remembered. Only successes go in.
	verified *lru.Cache[[sha256.Size]byte, struct{}]
}

// NewKeyring holds keys, and remembers up to VerifyCacheSize successful
// verifications. It returns ErrBadKey when two keys share an id.
func NewKeyring(keys ...VerifyKey) (Keyring, error) {
	return newKeyring(VerifyCacheSize, keys...)
}

// newKeyring is NewKeyring remembering up to cacheSize successful
// verifications (0: none).
func newKeyring(cacheSize int, keys ...VerifyKey) (Keyring, error) {
	r := Keyring{keys: make(map[string]ed25519.PublicKey, len(keys))}
	if cacheSize > 0 {
		c, err := lru.New[[sha256.Size]byte, struct{}](cacheSize)
		if err != nil { // only for a size below 1
			return Keyring{}, fmt.Errorf("fenceproof: verify cache: %w", err)
		}
		r.verified = c
	}
	for _, k := range keys {
		if k.pub == nil {
			return Keyring{}, fmt.Errorf("%w: zero VerifyKey", ErrBadKey)
		}
		if _, dup := r.keys[k.id]; dup {
			return Keyring{}, fmt.Errorf("%w: key id %q given twice", ErrBadKey, k.id)
		}
		r.keys[k.id] = k.pub
	}
	return r, nil
}

// ParseKeyring reads a comma-separated list of VerifyKey strings (spaces
// around entries are ignored). It returns ErrBadKey (wrapped) for a bad
// entry (including a key no honest signer has: not a curve point, or of
// small order, under which signatures can be forged), a repeated id, or
// an empty list.
func ParseKeyring(s string) (Keyring, error) {
	var keys []VerifyKey
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		id, raw, err := splitKey(part, ed25519.PublicKeySize)
		if err != nil {
			return Keyring{}, err
		}
		if err := checkPublicKey(raw); err != nil {
			return Keyring{}, fmt.Errorf("%w: key %q: %v", ErrBadKey, id, err)
		}
		keys = append(keys, VerifyKey{id: id, pub: ed25519.PublicKey(raw)})
	}
	if len(keys) == 0 {
		return Keyring{}, fmt.Errorf("%w: no key in the list", ErrBadKey)
	}
	return NewKeyring(keys...)
}

// Len returns the number of keys in r.
func (r Keyring) Len() int { return len(r.keys) }

// IDs returns the key ids of r, in no particular order.
func (r Keyring) IDs() []string {
	ids := make([]string, 0, len(r.keys))
	for id := range r.keys {
		ids = append(ids, id)
	}
	return ids
}

// SignGrant returns the proof that lock key was granted with token,
// signed at issued (carried to millisecond precision, for diagnostics):
// "v1.<issued unix ms>.<key id>.<base64url signature>". lock-server sends
// it with every grant (lockserver/api Grant.Proof).
func (k SigningKey) SignGrant(key string, token int64, issued time.Time) string {
	ms := strconv.FormatInt(issued.UnixMilli(), 10)
	return version + "." + ms + "." + k.Sign(grantDomain, key, strconv.FormatInt(token, 10), ms)
}

// Grant is what a valid grant proof says.
type Grant struct {
	// KeyID is the id of the signing key.
	KeyID string
	// Issued is when lock-server signed the proof, by its clock (ms
	// precision). Informative only: never compare it with another clock.
	Issued time.Time
}

// VerifyGrant checks that proof was made by a key of r for exactly this
// lock key and token. It returns ErrMissing for an empty proof,
// ErrMalformed, ErrUnknownKey, or ErrInvalid (all wrapped).
func (r Keyring) VerifyGrant(proof, key string, token int64) (Grant, error) {
	ms, sig, err := splitGrant(proof)
	if err != nil {
		return Grant{}, err
	}
	id, err := r.Verify(sig, grantDomain, key, strconv.FormatInt(token, 10), ms)
	if err != nil {
		return Grant{}, err
	}
	n, _ := strconv.ParseInt(ms, 10, 64) // checked by splitGrant
	return Grant{KeyID: id, Issued: time.UnixMilli(n).UTC()}, nil
}

// CheckGrant judges a grant proof's form alone, without keys: nil, or
// ErrMissing for an empty proof, or ErrMalformed (wrapped), exactly as
// VerifyGrant would answer it. A fence point calls it before its
// database work, so that a proof no key could verify is refused whatever
// the database's state; a proof that passes may still fail VerifyGrant
// (ErrUnknownKey, ErrInvalid).
func CheckGrant(proof string) error {
	_, sig, err := splitGrant(proof)
	if err != nil {
		return err
	}
	_, _, err = splitSig(sig)
	return err
}

// splitGrant splits a v1 grant proof into its signing time (decimal unix
// ms, canonical) and its "<key id>.<signature>" part, unchecked. It
// returns ErrMissing or ErrMalformed (wrapped).
func splitGrant(proof string) (ms, sig string, err error) {
	if proof == "" {
		return "", "", ErrMissing
	}
	if len(proof) > MaxProofLen {
		return "", "", fmt.Errorf("%w: %d bytes", ErrMalformed, len(proof))
	}
	rest, ok := strings.CutPrefix(proof, version+".")
	if !ok {
		return "", "", fmt.Errorf("%w: want the %s prefix", ErrMalformed, version)
	}
	ms, sig, ok = strings.Cut(rest, ".")
	n, err := strconv.ParseInt(ms, 10, 64)
	if !ok || err != nil || n < 0 || strconv.FormatInt(n, 10) != ms {
		return "", "", fmt.Errorf("%w: bad signing time", ErrMalformed)
	}
	return ms, sig, nil
}

// Sign returns "<key id>.<base64url signature>" over domain and fields,
// each length-prefixed so that no two lists of fields sign the same bytes.
// domain names the kind of statement; a signature never verifies under
// another domain.
func (k SigningKey) Sign(domain string, fields ...string) string {
	sig := ed25519.Sign(k.priv, message(domain, fields))
	return k.id + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// Verify checks a signature made by Sign with a key of r over exactly
// domain and fields, and returns the key id. It returns ErrMissing,
// ErrMalformed, ErrUnknownKey or ErrInvalid (wrapped).
func (r Keyring) Verify(sig, domain string, fields ...string) (string, error) {
	id, raw, err := splitSig(sig)
	if err != nil {
		return "", err
	}
	// The id first, always: a key that is not (or no longer) in the ring
	// verifies nothing, whatever the cache remembers.
	pub, ok := r.keys[id]
	if !ok {
		return "", fmt.Errorf("%w: %q", ErrUnknownKey, id)
	}
	if !r.verify(pub, message(domain, fields), raw) {
		return "", ErrInvalid
	}
	return id, nil
}

// verify is ed25519.Verify(pub, msg, sig), answered from r's cache when
// the same triple verified before. Ed25519 verification is a pure
// function of the three, so a remembered success is exactly the answer a
// new verification would give. Failures are not remembered: each of a
// forger's attempts pays the full check and evicts no genuine proof.
func (r Keyring) verify(pub ed25519.PublicKey, msg, sig []byte) bool {
	if r.verified == nil {
		return ed25519.Verify(pub, msg, sig)
	}
	d := verifyDigest(pub, msg, sig)
	if _, ok := r.verified.Get(d); ok {
		return true
	}
	if !ed25519.Verify(pub, msg, sig) {
		return false
	}
	r.verified.Add(d, struct{}{})
	return true
}

// verifyDigest is the cache key of a verification: SHA-256 over the
// public key, the message and the signature, each prefixed by its length
// (8 bytes, big-endian), so that it binds all three exactly: no two
// triples hash the same bytes, and a wrong hit would take a SHA-256
// collision.
func verifyDigest(pub ed25519.PublicKey, msg, sig []byte) [sha256.Size]byte {
	var buf [512]byte // on the stack for every message this project signs
	b := buf[:0]
	for _, part := range [][]byte{pub, msg, sig} {
		b = binary.BigEndian.AppendUint64(b, uint64(len(part)))
		b = append(b, part...)
	}
	return sha256.Sum256(b)
}

// splitSig reads "<key id>.<base64url signature>" (Sign's form) into the
// key id and the signature's bytes, without keys. It returns ErrMissing or
// ErrMalformed (wrapped).
func splitSig(sig string) (id string, raw []byte, err error) {
	if sig == "" {
		return "", nil, ErrMissing
	}
	if len(sig) > MaxProofLen {
		return "", nil, fmt.Errorf("%w: %d bytes", ErrMalformed, len(sig))
	}
	id, b64, ok := strings.Cut(sig, ".")
	if !ok || checkID(id) != nil {
		return "", nil, fmt.Errorf("%w: want <key id>.<signature>", ErrMalformed)
	}
	// Strict: one text per signature (the lenient decoder accepts a last
	// character with unused bits set, so a signature has several spellings).
	raw, err = base64.RawURLEncoding.Strict().DecodeString(b64)
	if err != nil || len(raw) != ed25519.SignatureSize {
		return "", nil, fmt.Errorf("%w: signature is not %d bytes of base64url", ErrMalformed, ed25519.SignatureSize)
	}
	return id, raw, nil
}

func message(domain string, fields []string) []byte {
	var b []byte
	for _, f := range append([]string{domain}, fields...) {
		b = strconv.AppendInt(b, int64(len(f)), 10)
		b = append(b, ':')
		b = append(b, f...)
	}
	return b
}

func checkID(id string) error {
	if id == "" || len(id) > MaxKeyIDLen {
		return fmt.Errorf("%w: key id must be 1..%d characters", ErrBadKey, MaxKeyIDLen)
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("%w: key id %q: only letters, digits, _ and -", ErrBadKey, id)
		}
	}
	return nil
}

// checkPublicKey refuses 32 bytes that cannot be an honest Ed25519
// public key: not the encoding of a curve point, or a point of small
// order (its multiple by the cofactor 8 is the identity). Under a
// small-order key, crypto/ed25519.Verify accepts signatures that anyone
// can make without a private key (the identity point accepts one
// signature for every message), so such a key in a fence point's
// keyring would let a caller forge grant proofs. A key from
// GenerateSigningKey never is one.
func checkPublicKey(raw []byte) error {
	p, err := new(edwards25519.Point).SetBytes(raw)
	if err != nil {
		return errors.New("not an Ed25519 public key (no curve point has this encoding)")
	}
	if new(edwards25519.Point).MultByCofactor(p).Equal(edwards25519.NewIdentityPoint()) == 1 {
		return errors.New("a point of small order: signatures under it can be forged without a private key")
	}
	return nil
}

func splitKey(s string, size int) (string, []byte, error) {
	id, b64, ok := strings.Cut(strings.TrimSpace(s), ":")
	if !ok {
		return "", nil, fmt.Errorf("%w: want id:base64url", ErrBadKey)
	}
	if err := checkID(id); err != nil {
		return "", nil, err
	}
	raw, err := base64.RawURLEncoding.DecodeString(b64)
	if err != nil || len(raw) != size {
		return "", nil, fmt.Errorf("%w: key %q: want %d bytes of base64url without padding", ErrBadKey, id, size)
	}
	return id, raw, nil
}
