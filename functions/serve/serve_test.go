package serve

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestNonCanonicalPathsGetTheEnvelope(t *testing.T) {
	h := canonical(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	for target, want := range map[string]int{
		"/v1/payouts/p-1":              http.StatusTeapot,
		"/v1/payouts/":                 http.StatusTeapot,
		"/v1/payouts/../../etc/passwd": http.StatusBadRequest,
		"/v1//payouts":                 http.StatusBadRequest,
		"/v1/./payouts":                http.StatusBadRequest,
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", target, nil))
		if rec.Code != want {
			t.Errorf("GET %s: %d; want %d", target, rec.Code, want)
		}
		if want == http.StatusBadRequest && rec.Header().Get("Content-Type") != "application/json" {
			t.Errorf("GET %s: not a JSON envelope", target)
		}
	}
}
