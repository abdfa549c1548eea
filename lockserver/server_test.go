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

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// newServer is a lock-server with the default configuration over store.
func newServer(t *testing.T, store store.LockStore) http.Handler {
	t.Helper()
	return serverWith(t, store, lockserver.DefaultServerConfig())
}

func do(h http.Handler, method, path, contentType, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestBadRequestsGetTheEnvelopeAndChangeNothing(t *testing.T) {
	store := memstore.New(nil)
	h := newServer(t, store)
	rec := do(h, "POST", "/v1/locks/payout:acct-1/acquire", "application/json", `{"owner":"worker-a","ttlMs":60000}`)
	if rec.Code != 200 {
		t.Fatalf("setup acquire: %d %s", rec.Code, rec.Body)
	}
	var g api.Grant
	if err := json.Unmarshal(rec.Body.Bytes(), &g); err != nil {
		t.Fatal(err)
	}
	before, _ := store.Inspect(context.Background(), "payout:acct-1")
	const ctJSON = "application/json"
	big := `{"owner":"` + strings.Repeat("a", api.MaxBodyBytes) + `","ttlMs":1000}`
	for _, tc := range []struct {
		name, method, path, ct, body string
		status                       int
		code                         api.Code
	}{
		{"malformed JSON", "POST", "/v1/locks/k/acquire", ctJSON, `{"owner":`, 400, api.CodeInvalidRequest},
		{"empty body", "POST", "/v1/locks/k/acquire", ctJSON, ``, 400, api.CodeInvalidRequest},
		{"array body", "POST", "/v1/locks/k/acquire", ctJSON, `[]`, 400, api.CodeInvalidRequest},
		{"unknown field", "POST", "/v1/locks/k/acquire", ctJSON, `{"owner":"w","ttlMs":1000,"priority":1}`, 400, api.CodeInvalidRequest},
		{"trailing data", "POST", "/v1/locks/k/acquire", ctJSON, `{"owner":"w","ttlMs":1000} {}`, 400, api.CodeInvalidRequest},
		{"missing owner", "POST", "/v1/locks/k/acquire", ctJSON, `{"ttlMs":1000}`, 400, api.CodeInvalidRequest},
		{"missing ttl", "POST", "/v1/locks/k/acquire", ctJSON, `{"owner":"w"}`, 400, api.CodeInvalidRequest},
		{"ttl too short", "POST", "/v1/locks/k/acquire", ctJSON, `{"owner":"w","ttlMs":1}`, 400, api.CodeInvalidRequest},
		{"ttl too long", "POST", "/v1/locks/k/acquire", ctJSON, `{"owner":"w","ttlMs":600001}`, 400, api.CodeInvalidRequest},
		{"ttl fractional", "POST", "/v1/locks/k/acquire", ctJSON, `{"owner":"w","ttlMs":1000.5}`, 400, api.CodeInvalidRequest},
		{"ttl as string", "POST", "/v1/locks/k/acquire", ctJSON, `{"owner":"w","ttlMs":"1000"}`, 400, api.CodeInvalidRequest},
		{"wait negative", "POST", "/v1/locks/payout:acct-1/acquire", ctJSON, `{"owner":"w","ttlMs":1000,"waitMs":-1}`, 400, api.CodeInvalidRequest},
		{"wait too short", "POST", "/v1/locks/payout:acct-1/acquire", ctJSON, fmt.Sprintf(`{"owner":"w","ttlMs":1000,"waitMs":%d}`, api.MinWaitMs-1), 400, api.CodeInvalidRequest},
		{"wait too long", "POST", "/v1/locks/payout:acct-1/acquire", ctJSON, fmt.Sprintf(`{"owner":"w","ttlMs":1000,"waitMs":%d}`, api.MaxWaitMs+1), 400, api.CodeInvalidRequest},
		{"wait as string", "POST", "/v1/locks/payout:acct-1/acquire", ctJSON, `{"owner":"w","ttlMs":1000,"waitMs":"100"}`, 400, api.CodeInvalidRequest},
		{"wait with bad owner", "POST", "/v1/locks/payout:acct-1/acquire", ctJSON, `{"owner":"w w","ttlMs":1000,"waitMs":100}`, 400, api.CodeInvalidRequest},
		{"oversized body", "POST", "/v1/locks/k/acquire", ctJSON, big, 413, api.CodeBodyTooLarge},
		{"wrong content type", "POST", "/v1/locks/k/acquire", "text/plain", `{"owner":"w","ttlMs":1000}`, 415, api.CodeUnsupportedMediaType},
		{"malformed key", "POST", "/v1/locks/-bad/acquire", ctJSON, `{"owner":"w","ttlMs":1000}`, 400, api.CodeInvalidRequest},
		{"key with space", "POST", "/v1/locks/a%20b/acquire", ctJSON, `{"owner":"w","ttlMs":1000}`, 400, api.CodeInvalidRequest},
		{"key too long", "POST", "/v1/locks/" + strings.Repeat("k", api.MaxKeyLen+1) + "/acquire", ctJSON, `{"owner":"w","ttlMs":1000}`, 400, api.CodeInvalidRequest},
		{"renew token 0", "POST", "/v1/locks/payout:acct-1/renew", ctJSON, `{"owner":"worker-a","token":0}`, 400, api.CodeInvalidRequest},
		{"renew token missing", "POST", "/v1/locks/payout:acct-1/renew", ctJSON, `{"owner":"worker-a"}`, 400, api.CodeInvalidRequest},
		{"release negative token", "POST", "/v1/locks/payout:acct-1/release", ctJSON, fmt.Sprintf(`{"owner":"worker-a","token":%d}`, -g.Token), 400, api.CodeInvalidRequest},
		{"release token as string", "POST", "/v1/locks/payout:acct-1/release", ctJSON, fmt.Sprintf(`{"owner":"worker-a","token":"%d"}`, g.Token), 400, api.CodeInvalidRequest},
		{"release missing owner", "POST", "/v1/locks/payout:acct-1/release", ctJSON, fmt.Sprintf(`{"token":%d}`, g.Token), 400, api.CodeInvalidRequest},
		{"revoke negative token", "POST", "/v1/locks/payout:acct-1/revoke", ctJSON, `{"token":-1}`, 400, api.CodeInvalidRequest},
		{"revoke reason too long", "POST", "/v1/locks/payout:acct-1/revoke", ctJSON, `{"reason":"` + strings.Repeat("r", api.MaxReasonLen+1) + `"}`, 400, api.CodeInvalidRequest},
		{"unknown operation", "POST", "/v1/locks/payout:acct-1/steal", ctJSON, `{}`, 404, api.CodeNotFound},
		{"unknown route", "GET", "/v2/locks", "", ``, 404, api.CodeNotFound},
		{"dot-dot path", "POST", "/v1/locks/../acquire", ctJSON, `{"owner":"w","ttlMs":1000}`, 400, api.CodeInvalidRequest},
		{"double slash path", "GET", "/v1//locks/k", "", ``, 400, api.CodeInvalidRequest},
		{"null body", "POST", "/v1/locks/payout:acct-1/revoke", ctJSON, `null`, 400, api.CodeInvalidRequest},
		{"field name in capitals", "POST", "/v1/locks/k/acquire", ctJSON, `{"OWNER":"w","TTLMS":1000}`, 400, api.CodeInvalidRequest},
		{"duplicate field", "POST", "/v1/locks/k/acquire", ctJSON, `{"owner":"w","owner":"x","ttlMs":1000}`, 400, api.CodeInvalidRequest},
		{"GET an operation", "GET", "/v1/locks/payout:acct-1/release", "", ``, 405, api.CodeMethodNotAllowed},
		{"DELETE a lock", "DELETE", "/v1/locks/payout:acct-1", "", ``, 405, api.CodeMethodNotAllowed},
		{"token never granted", "POST", "/v1/locks/payout:acct-1/release", ctJSON, fmt.Sprintf(`{"owner":"worker-a","token":%d}`, g.Token+1000), 409, api.CodeLeaseNotHeld},
		{"wrong owner", "POST", "/v1/locks/payout:acct-1/release", ctJSON, fmt.Sprintf(`{"owner":"mallory","token":%d}`, g.Token), 409, api.CodeLeaseNotHeld},
		{"held", "POST", "/v1/locks/payout:acct-1/acquire", ctJSON, `{"owner":"worker-b","ttlMs":1000}`, 409, api.CodeLockHeld},
		// null is refused for every field of every request:
		// "waitMs": null read as no wait, and a revoke's "token": null as 0,
		// an unconditional revoke.
		{"wait null", "POST", "/v1/locks/k/acquire", ctJSON, `{"owner":"w","ttlMs":1000,"waitMs":null}`, 400, api.CodeInvalidRequest},
		{"ttl null", "POST", "/v1/locks/k/acquire", ctJSON, `{"owner":"w","ttlMs":null}`, 400, api.CodeInvalidRequest},
		{"owner null", "POST", "/v1/locks/k/acquire", ctJSON, `{"owner":null,"ttlMs":1000}`, 400, api.CodeInvalidRequest},
		{"renew token null", "POST", "/v1/locks/payout:acct-1/renew", ctJSON, `{"owner":"worker-a","token":null}`, 400, api.CodeInvalidRequest},
		{"release token null", "POST", "/v1/locks/payout:acct-1/release", ctJSON, `{"owner":"worker-a","token": null }`, 400, api.CodeInvalidRequest},
		{"revoke token null", "POST", "/v1/locks/payout:acct-1/revoke", ctJSON, `{"token":null}`, 400, api.CodeInvalidRequest},
		{"revoke reason null", "POST", "/v1/locks/payout:acct-1/revoke", ctJSON, `{"reason":null}`, 400, api.CodeInvalidRequest},
		// A log-forging reason was accepted (newcomer probe, session 7).
		{"revoke reason with a newline and an escape", "POST", "/v1/locks/payout:acct-1/revoke", ctJSON, `{"reason":"a\nlevel=ERROR \u001b[31m"}`, 400, api.CodeInvalidRequest},
		// One Content-Type rule for every service (jsonhandler.ContentType).
		{"no content type with a body", "POST", "/v1/locks/k/acquire", "", `{"owner":"w","ttlMs":1000}`, 415, api.CodeUnsupportedMediaType},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := do(h, tc.method, tc.path, tc.ct, tc.body)
			if rec.Code != tc.status {
				t.Fatalf("status %d; want %d (body %s)", rec.Code, tc.status, rec.Body)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Fatalf("Content-Type %q; want application/json", ct)
			}
			var env api.ErrorEnvelope
			dec := json.NewDecoder(bytes.NewReader(rec.Body.Bytes()))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&env); err != nil {
				t.Fatalf("body is not an error envelope: %v: %s", err, rec.Body)
			}
			if env.Error.Code != tc.code || env.Error.Message == "" || env.Error.Retryable != tc.code.Retryable() {
				t.Fatalf("envelope %+v; want code %s, a message, retryable=%v", env.Error, tc.code, tc.code.Retryable())
			}
			// The message is for people and stable: no Go package names from
			// a wrapped error chain ("lockserver: ...", "json: ...").
			for _, goName := range []string{"lockserver:", "api:", "json:", "strconv", "memstore:"} {
				if strings.Contains(env.Error.Message, goName) {
					t.Fatalf("message %q carries the Go error chain (%s)", env.Error.Message, goName)
				}
			}
		})
	}
	after, _ := store.Inspect(context.Background(), "payout:acct-1")
	if after.Lease == nil || *after.Lease != *before.Lease || after.LastToken != before.LastToken {
		t.Fatalf("bad requests changed the lock: before %+v, after %+v", before.Lease, after.Lease)
	}
	if st, _ := store.Inspect(context.Background(), "k"); st.LastToken != 0 {
		t.Fatalf("bad requests granted key k: %+v", st)
	}
}

func TestHappyPathShapes(t *testing.T) {
	h := newServer(t, memstore.New(nil))
	rec := do(h, "POST", "/v1/locks/payout:acct-7/acquire", "application/json; charset=utf-8", `{"owner":"worker-a","ttlMs":2000}`)
	if rec.Code != 200 {
		t.Fatalf("acquire: %d %s", rec.Code, rec.Body)
	}
	var g api.Grant
	_ = json.Unmarshal(rec.Body.Bytes(), &g)
	if g.Key != "payout:acct-7" || g.Owner != "worker-a" || g.Token <= 0 || g.TTLMs != 2000 || g.LeaseID == "" || time.Until(g.ExpiresAt) <= 0 {
		t.Fatalf("grant %+v", g)
	}
	rec = do(h, "GET", "/v1/locks/payout:acct-7", "", "")
	var st api.LockState
	_ = json.Unmarshal(rec.Body.Bytes(), &st)
	if rec.Code != 200 || !st.Held || st.Lease == nil || st.Lease.Token != g.Token || st.LastToken != g.Token {
		t.Fatalf("inspect: %d %s", rec.Code, rec.Body)
	}
	rec = do(h, "POST", "/v1/locks/payout:acct-7/renew", "application/json", fmt.Sprintf(`{"owner":"worker-a","token":%d}`, g.Token))
	if rec.Code != 200 {
		t.Fatalf("renew: %d %s", rec.Code, rec.Body)
	}
	rec = do(h, "POST", "/v1/locks/payout:acct-7/release", "application/json", fmt.Sprintf(`{"owner":"worker-a","token":%d}`, g.Token))
	if rec.Code != 204 || rec.Body.Len() != 0 {
		t.Fatalf("release: %d %q", rec.Code, rec.Body)
	}
	for _, p := range []string{api.PathHealth, api.PathReady} {
		if rec := do(h, "GET", p, "", ""); rec.Code != 200 {
			t.Fatalf("%s: %d", p, rec.Code)
		}
	}
}

// downStore is a LockStore whose backend never answers.
type downStore struct{ store.LockStore }

func (downStore) Ping(context.Context) error { return store.ErrUnavailable }
func (downStore) Acquire(context.Context, string, string, time.Duration) (store.Lease, error) {
	return store.Lease{}, fmt.Errorf("%w: connection refused", store.ErrUnavailable)
}

func TestBackendDownIs503Retryable(t *testing.T) {
	h := newServer(t, downStore{memstore.New(nil)})
	for _, rec := range []*httptest.ResponseRecorder{
		do(h, "GET", api.PathReady, "", ""),
		do(h, "POST", "/v1/locks/k/acquire", "application/json", `{"owner":"w","ttlMs":1000}`),
	} {
		var env api.ErrorEnvelope
		_ = json.Unmarshal(rec.Body.Bytes(), &env)
		if rec.Code != 503 || env.Error.Code != api.CodeBackendUnavailable || !env.Error.Retryable {
			t.Fatalf("got %d %s; want 503 BACKEND_UNAVAILABLE retryable", rec.Code, rec.Body)
		}
		if strings.Contains(env.Error.Message, "connection refused") {
			t.Fatalf("503 message leaks the backend's error: %q", env.Error.Message)
		}
	}
}
