package fencing_test

import (
	"errors"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
)

// FuzzHeaders reads arbitrary X-Fencing-Token and X-Fencing-Proof headers
// (once, or twice): a token is accepted only as one positive decimal
// integer in canonical form (no sign, no leading zero; spaces around it
// are trimmed), a refusal wraps ErrMissingToken or ErrBadToken, and a
// proof is read only when sent exactly once.
func FuzzHeaders(f *testing.F) {
	for _, s := range []struct {
		token, proof string
		twice        bool
	}{
		{"42", "v1.1.k.sig", false},
		{"", "", false},
		{"0", "", false},
		{"-1", "", false},
		{"+1", "", false},
		{"007", "", false},
		{" 7 ", " v1 ", false},
		{"9223372036854775807", "", false},
		{"9223372036854775808", "", false},
		{"1e3", "", false},
		{"0x10", "", false},
		{"1_000", "", false},
		{"٣", "", false},
		{"5", "p", true},
	} {
		f.Add(s.token, s.proof, s.twice)
	}
	f.Fuzz(func(t *testing.T, token, proof string, twice bool) {
		r := httptest.NewRequest("POST", "/", nil)
		if token != "" {
			r.Header.Add(fencewire.HeaderToken, token)
			if twice {
				r.Header.Add(fencewire.HeaderToken, token)
			}
		}
		if proof != "" {
			r.Header.Add(fencewire.HeaderProof, proof)
			if twice {
				r.Header.Add(fencewire.HeaderProof, proof)
			}
		}
		tok, err := fencing.TokenFrom(r)
		switch {
		case token == "":
			if !errors.Is(err, fencing.ErrMissingToken) {
				t.Fatalf("no token header: %d, %v; want ErrMissingToken", tok, err)
			}
		case err != nil:
			if !errors.Is(err, fencing.ErrBadToken) {
				t.Fatalf("TokenFrom(%q) = %v; want ErrBadToken", token, err)
			}
		default:
			if twice || tok <= 0 || strconv.FormatInt(tok, 10) != strings.TrimSpace(token) {
				t.Fatalf("TokenFrom(%q, twice=%v) accepted %d", token, twice, tok)
			}
		}
		got, err := fencing.ProofFrom(r)
		if want := strings.TrimSpace(proof); twice && (got != "" || !errors.Is(err, fencing.ErrRepeatedProof)) ||
			!twice && (got != want || err != nil) {
			t.Fatalf("ProofFrom(%q, twice=%v) = %q, %v", proof, twice, got, err)
		}
	})
}
