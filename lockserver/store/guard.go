package store

// MaxAdvancePast bounds the N of a store's Advance (2^53 - 1): tokens stay
// below 2^53 so that every JSON client reads them exactly (package api), and
// a typo must not push every later token out of that range.
const MaxAdvancePast = 1<<53 - 1

// Advanced is what a store's Advance reports: the backend instance it has
// stamped as the one it issues tokens on, and the bound every later token
// is above. Stores with a restore guard (pgstore, etcdstore) return it from
// their Advance method, which lockctl's "advance" command calls.
type Advanced struct {
	// Previous is the identity stamped before the call, "" when none.
	Previous string `json:"previous"`
	// Identity is the identity of the backend now, stamped by the call.
	Identity string `json:"identity"`
	// Past is the largest token ever issued, as the operator gave it.
	Past int64 `json:"past"`
	// NextAbove is a bound, at least Past, that every token issued after
	// the call is greater than.
	NextAbove int64 `json:"nextAbove"`
}
