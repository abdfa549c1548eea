package lockserver_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// lockReq is one request of the probe tests, with its expected answer.
type lockReq struct {
	name, method, path, ct, body string
	status                       int
	code                         api.Code
}

func (q lockReq) check(t *testing.T, h http.Handler, suffix string) {
	t.Helper()
	req := httptest.NewRequest(q.method, q.path, strings.NewReader(q.body))
	if q.ct != "" {
		req.Header.Set("Content-Type", q.ct)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var env api.ErrorEnvelope
	if rec.Code != q.status || json.Unmarshal(rec.Body.Bytes(), &env) != nil || env.Error.Code != q.code {
		t.Fatalf("%s%s: %d %s; want %d %s", q.name, suffix, rec.Code, rec.Body, q.status, q.code)
	}
}

// Newcomer probe, at lock-server: while the
// backend was marked stalled, every request was answered 503
// BACKEND_UNAVAILABLE, a malformed body or an invalid owner included: the
// breaker ran before the body was read. Now bad input gets its own 4xx
// code whatever the backend's state and never reaches the store, and a
// good request still gets the breaker's fast 503. The order is the
// server's, the same over every LockStore (a gate over memstore stands
// for a frozen PostgreSQL or etcd here).
func TestBadInputWhileTheBackendIsStalledGetsItsOwn4xx(t *testing.T) {
	h, store, _ := newStalledServer(t)
	wantRefused(t, "a good acquire while stalled", acquireReq(h, "k1"), api.CodeBackendUnavailable)

	js := "application/json"
	acquire, renew := api.PathLockPrefix+"k1"+api.SuffixAcquire, api.PathLockPrefix+"k1"+api.SuffixRenew
	release, revoke := api.PathLockPrefix+"k1"+api.SuffixRelease, api.PathLockPrefix+"k1"+api.SuffixRevoke
	for _, q := range []lockReq{
		{"acquire: malformed JSON", "POST", acquire, js, `{"owner":`, 400, api.CodeInvalidRequest},
		{"acquire: unknown field", "POST", acquire, js, `{"owner":"w","ttlMs":60000,"force":true}`, 400, api.CodeInvalidRequest},
		{"acquire: ttl out of bounds", "POST", acquire, js, `{"owner":"w","ttlMs":1}`, 400, api.CodeInvalidRequest},
		{"acquire: empty owner", "POST", acquire, js, `{"owner":"","ttlMs":60000}`, 400, api.CodeInvalidRequest},
		{"acquire: owner with a space", "POST", acquire, js, `{"owner":"a b","ttlMs":60000}`, 400, api.CodeInvalidRequest},
		{"acquire: text body", "POST", acquire, "text/plain", `{"owner":"w","ttlMs":60000}`, 415, api.CodeUnsupportedMediaType},
		{"acquire: query parameter", "POST", acquire + "?waitMs=5", js, `{"owner":"w","ttlMs":60000}`, 400, api.CodeInvalidRequest},
		{"acquire: bad key", "POST", api.PathLockPrefix + "-k" + api.SuffixAcquire, js, `{"owner":"w","ttlMs":60000}`, 400, api.CodeInvalidRequest},
		{"renew: malformed JSON", "POST", renew, js, `[`, 400, api.CodeInvalidRequest},
		{"renew: zero token", "POST", renew, js, `{"owner":"w","token":0}`, 400, api.CodeInvalidRequest},
		{"release: missing owner", "POST", release, js, `{"token":7}`, 400, api.CodeInvalidRequest},
		{"revoke: negative token", "POST", revoke, js, `{"token":-1}`, 400, api.CodeInvalidRequest},
		{"revoke: reason with a newline", "POST", revoke, js, `{"token":7,"reason":"a\nb"}`, 400, api.CodeInvalidRequest},
		{"inspect: bad key", "GET", api.PathLockPrefix + "-k", "", "", 400, api.CodeInvalidRequest},
		{"inspect: query parameter", "GET", api.PathLockPrefix + "k1?full=1", "", "", 400, api.CodeInvalidRequest},
		{"unknown operation", "POST", api.PathLockPrefix + "k1/steal", js, `{}`, 404, api.CodeNotFound},
		{"wrong method", "GET", acquire, "", "", 405, api.CodeMethodNotAllowed},
	} {
		q.check(t, h, " while the backend is stalled")
	}
	if n := store.calls.Load(); n != 1 {
		t.Fatalf("the store was called %d times; want once (the request that met the stall)", n)
	}
}

// Newcomer probe, at lock-server: a query
// parameter was ignored ("POST .../acquire?waitMs=5000" granted at once,
// without the wait its sender asked for). Now every route of the lock API
// refuses one, 400 INVALID_REQUEST, and nothing is granted.
func TestQueryParametersAreRefusedByTheLockAPI(t *testing.T) {
	h := serverWith(t, memstore.New(nil), lockserver.DefaultServerConfig())
	js := "application/json"
	for _, q := range []lockReq{
		{"acquire", "POST", api.PathLockPrefix + "k1" + api.SuffixAcquire + "?waitMs=5000", js, `{"owner":"w","ttlMs":60000}`, 400, api.CodeInvalidRequest},
		{"acquire, malformed query", "POST", api.PathLockPrefix + "k1" + api.SuffixAcquire + "?a=%zz", js, `{"owner":"w","ttlMs":60000}`, 400, api.CodeInvalidRequest},
		{"revoke", "POST", api.PathLockPrefix + "k1" + api.SuffixRevoke + "?token=1", js, `{}`, 400, api.CodeInvalidRequest},
		{"inspect", "GET", api.PathLockPrefix + "k1?full=1", "", "", 400, api.CodeInvalidRequest},
	} {
		q.check(t, h, "")
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", api.PathLockPrefix+"k1", nil))
	var st api.LockState
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &st) != nil || st.Held || st.LastToken != 0 {
		t.Fatalf("after the refused requests: %d %s; want k1 never granted", rec.Code, rec.Body)
	}
}
