package fenceproof

// NewKeyringWithCache is NewKeyring remembering up to size successful
// verifications (0: none), for tests and benchmarks of the cache.
func NewKeyringWithCache(size int, keys ...VerifyKey) (Keyring, error) {
	return newKeyring(size, keys...)
}

// Remembered returns how many successful verifications r remembers.
func Remembered(r Keyring) int {
	if r.verified == nil {
		return 0
	}
	return r.verified.Len()
}
