package lockserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/fuzztest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof/fenceprooftest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// fuzzMethods are the methods a fuzz input picks from (by index): a
// request line's method is a token, checked by net/http before a handler.
var fuzzMethods = []string{http.MethodPost, http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodOptions}

// heldKey is held by heldOwner with token 1 before every fuzz input.
const (
	heldKey   = "payout:acct-1"
	heldOwner = "worker-a"
)

// lockSnapshot is what a request may change in a memstore: the state of
// the keys it names, and the next token the store would draw.
func lockSnapshot(store *memstore.Store, keys ...string) string {
	var b strings.Builder
	for _, k := range keys {
		st, err := store.Inspect(context.Background(), k)
		fmt.Fprintf(&b, "%q: held=%v last=%d %v", k, st.Lease != nil, st.LastToken, err)
		if st.Lease != nil {
			fmt.Fprintf(&b, " lease %+v", *st.Lease)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// FuzzLockServer sends one request with an arbitrary method, key,
// operation, content type and body to a lock-server (memstore, grant
// proofs on, metrics on) where heldKey is held, and checks the answer's
// properties (package fuzztest), that a refused request changed no lease
// and drew no token, and that every 200 grant is for the key asked, signed
// for exactly its key and token.
//
// The last argument is sent as X-Fencing-Token (which lock-server ignores)
// and as the caller's budget, api.HeaderTimeoutMs.
func FuzzLockServer(f *testing.F) {
	ct := "application/json"
	for _, s := range []struct {
		method        uint8
		key, op, ct   string
		body          string
		fencingHeader string
	}{
		{0, "payout:acct-2", "acquire", ct, `{"owner":"worker-b","ttlMs":60000}`, ""},
		{0, heldKey, "acquire", ct, `{"owner":"worker-b","ttlMs":60000}`, ""},
		{0, heldKey, "renew", ct, `{"owner":"worker-a","token":1}`, ""},
		{0, heldKey, "release", ct, `{"owner":"worker-a","token":1}`, ""},
		{0, heldKey, "revoke", ct, `{"token":1,"reason":"stuck"}`, ""},
		{0, heldKey, "revoke", ct, `{}`, ""},
		{1, heldKey, "", "", ``, ""},
		{0, heldKey, "release", ct, `{"owner":"worker-a","token":2}`, ""},
		{0, heldKey, "renew", ct, `{"owner":"mallory","token":1}`, ""},
		{0, "k", "acquire", ct, `{"owner":`, ""},
		{0, "k", "acquire", ct, `{"owner":"w","ttlMs":1000} {}`, ""},
		{0, "k", "acquire", ct, `{"owner":"w","owner":"x","ttlMs":1000}`, ""},
		{0, "k", "acquire", ct, `{"owner":"w\xff","ttlMs":1000}`, ""},
		{0, "k", "acquire", ct, `{"owner":"w","ttlMs":1e400}`, ""},
		{0, "k", "acquire", ct, `{"owner":"w","ttlMs":9223372036854775807}`, ""},
		{0, "k", "acquire", "text/plain", `{"owner":"w","ttlMs":1000}`, ""},
		{0, "k", "acquire", "application/json; charset=\"", `{"owner":"w","ttlMs":1000}`, ""},
		{0, "-bad", "acquire", ct, `{"owner":"w","ttlMs":1000}`, ""},
		{0, "..", "acquire", ct, `{"owner":"w","ttlMs":1000}`, ""},
		{0, "a/b", "acquire", ct, `{"owner":"w","ttlMs":1000}`, ""},
		{0, "k\x00", "renew", ct, `{"owner":"w","token":-1}`, ""},
		{0, heldKey, "steal", ct, `{}`, ""},
		{4, heldKey, "release", ct, `{"owner":"worker-a","token":1}`, ""},
		{0, heldKey, "revoke", ct, `{"reason":"` + strings.Repeat("r", api.MaxReasonLen+1) + `"}`, ""},
		{0, "k", "acquire", ct, `{"owner":"` + strings.Repeat("a", api.MaxBodyBytes) + `","ttlMs":1000}`, ""},
		{0, "k", "acquire", ct, `{"owner":"w","ttlMs":1000}`, "9223372036854775807"},
		{0, "k", "acquire", ct, `{"owner":"w","ttlMs":1000}`, "1"},
		{0, "k", "acquire", ct, `{"owner":"w","ttlMs":1000}`, "-5"},
	} {
		f.Add(s.method, s.key, s.op, s.ct, []byte(s.body), s.fencingHeader)
	}
	proofKeys := fenceprooftest.ProofKeys()
	f.Fuzz(func(t *testing.T, method uint8, key, op, contentType string, body []byte, token string) {
		if strings.ContainsAny(contentType+token, "\r\n\x00") {
			return // net/http refuses such header values before any handler
		}
		store := memstore.New(nil)
		if _, err := store.Acquire(context.Background(), heldKey, heldOwner, time.Minute); err != nil {
			t.Fatal(err)
		}
		cfg := lockserver.DefaultServerConfig()
		cfg.ProofKey = fenceprooftest.LockSigningKey()
		cfg.Registry = prometheus.NewRegistry()
		h := serverWith(t, store, cfg)
		p := api.PathLockPrefix + key
		if op != "" {
			p += "/" + op
		}
		// A non-canonical path is sent too: lock-server refuses it itself
		// (its canonical check), with the envelope, never a redirect.
		req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
		req.Method = fuzzMethods[int(method)%len(fuzzMethods)]
		req.URL.Path, req.URL.RawPath = p, ""
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		if token != "" {
			// lock-server reads no fencing header: it must not change a
			// thing. It does read the caller's budget, from any string.
			req.Header.Set("X-Fencing-Token", token)
			req.Header.Set(api.HeaderTimeoutMs, token)
		}
		// No budget may bring a 503: one too short for the backend call
		// (below api.MinRequestTimeoutMs) is refused 400 before anything.
		var opts fuzztest.Options
		before := lockSnapshot(store, key, heldKey)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		a := fuzztest.FromRecorder(rec)
		if err := fuzztest.Check(a, opts, p, contentType, string(body), token); err != nil {
			t.Fatalf("%s %q: %v", req.Method, p, err)
		}
		if a.Status >= 400 {
			if after := lockSnapshot(store, key, heldKey); after != before {
				t.Fatalf("refused %s %q (%d) changed the store:\nbefore %s\nafter  %s", req.Method, p, a.Status, before, after)
			}
			probe, err := store.Acquire(context.Background(), "probe", "prober", time.Second)
			if err != nil || probe.Token != 2 {
				t.Fatalf("refused %s %q (%d) drew a token: the next grant has token %d (%v); want 2", req.Method, p, a.Status, probe.Token, err)
			}
			return
		}
		if a.Status == http.StatusOK && req.Method == http.MethodPost && (op == "acquire" || op == "renew") {
			var g api.Grant
			if err := json.Unmarshal(a.Body, &g); err != nil {
				t.Fatalf("%s answered 200 with %s: %v", op, a.Body, err)
			}
			if g.Key != key || g.Token <= 0 {
				t.Fatalf("%s of %q answered grant %+v", op, key, g)
			}
			if _, err := proofKeys.VerifyGrant(g.Proof, key, g.Token); err != nil {
				t.Fatalf("%s of %q: proof %q does not verify for token %d: %v", op, key, g.Proof, g.Token, err)
			}
		}
	})
}
