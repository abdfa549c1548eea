package lockserver_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof/fenceprooftest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// A Server with a ProofKey signs the grants it answers to the holder
// (acquire, renew) for exactly their key and token, and gives no proof to
// anyone else (inspect, revoke).
func TestGrantsToTheHolderCarryAProofOfTheirKeyAndToken(t *testing.T) {
	cfg := lockserver.DefaultServerConfig()
	cfg.ProofKey = fenceprooftest.LockSigningKey()
	h := serverWith(t, memstore.New(nil), cfg)
	keys := fenceprooftest.ProofKeys()
	grant := func(rec []byte) api.Grant {
		t.Helper()
		var g api.Grant
		if err := json.Unmarshal(rec, &g); err != nil {
			t.Fatalf("%s: %v", rec, err)
		}
		return g
	}
	rec := do(h, "POST", "/v1/locks/payout:acct-1/acquire", "application/json", `{"owner":"w","ttlMs":60000}`)
	g := grant(rec.Body.Bytes())
	if _, err := keys.VerifyGrant(g.Proof, "payout:acct-1", g.Token); err != nil {
		t.Fatalf("acquire's proof %q does not verify for its key and token %d: %v", g.Proof, g.Token, err)
	}
	if _, err := keys.VerifyGrant(g.Proof, "payout:acct-2", g.Token); !errors.Is(err, fenceproof.ErrInvalid) {
		t.Fatalf("acquire's proof verifies for another key: %v", err)
	}
	rec = do(h, "POST", "/v1/locks/payout:acct-1/renew", "application/json", `{"owner":"w","token":1}`)
	if r := grant(rec.Body.Bytes()); r.Proof == "" || r.Token != g.Token {
		t.Fatalf("renew answered %+v; want the same token with a proof", r)
	} else if _, err := keys.VerifyGrant(r.Proof, "payout:acct-1", r.Token); err != nil {
		t.Fatalf("renew's proof: %v", err)
	}
	rec = do(h, "GET", "/v1/locks/payout:acct-1", "", "")
	var st api.LockState
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil || st.Lease == nil || st.Lease.Proof != "" {
		t.Fatalf("inspect answered %s; want the lease without a proof", rec.Body)
	}
	rec = do(h, "POST", "/v1/locks/payout:acct-1/revoke", "application/json", `{}`)
	if r := grant(rec.Body.Bytes()); r.Token != g.Token || r.Proof != "" {
		t.Fatalf("revoke answered %+v; want the revoked lease without a proof", r)
	}

	// Without a key, grants carry no proof.
	rec = do(newServer(t, memstore.New(nil)), "POST", "/v1/locks/k/acquire", "application/json", `{"owner":"w","ttlMs":60000}`)
	if g := grant(rec.Body.Bytes()); g.Proof != "" {
		t.Fatalf("a Server without a ProofKey signed %q", g.Proof)
	}
}
