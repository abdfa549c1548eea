package railproxy_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
)

// TestOwnerHeaderIsHeldToLockServersRule: an
// X-Lock-Owner that lock-server would not grant a lease to (invalid
// UTF-8, a control character, a valid UTF-8 id longer than 128 bytes
// that a cut would split mid-character, a repeated header) is refused 400
// INVALID_REQUEST before the fence: no attempt row, no high-water, no
// rail call, no PostgreSQL text in the answer.
func TestOwnerHeaderIsHeldToLockServersRule(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	for name, vals := range map[string][]string{
		"invalid UTF-8":       {"\xff"},
		"a control character": {"a\x01b"},
		"130 bytes of é":      {strings.Repeat("é", 65)},
		"129 ASCII bytes":     {strings.Repeat("a", 129)},
		"the header twice":    {"a", "b"},
		"an empty header":     {""},
	} {
		req := httptest.NewRequest("POST", api.PathSubmissions, strings.NewReader(body("po-1", "acct-1", 2500)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(fencewire.HeaderToken, "42")
		for _, v := range vals {
			req.Header.Add(fencewire.HeaderOwner, v)
		}
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, req)
		if rec.Code != http.StatusBadRequest || envelope(t, rec).Code != api.CodeInvalidRequest {
			t.Errorf("%s: %d %s; want 400 %s", name, rec.Code, rec.Body, api.CodeInvalidRequest)
		}
		if bytes.Contains(rec.Body.Bytes(), []byte("SQLSTATE")) {
			t.Errorf("%s: answer %s carries PostgreSQL's text", name, rec.Body)
		}
	}
	if n := r.attemptRows(); n != 0 {
		t.Fatalf("%d attempt rows after refused owners; want 0", n)
	}
	if hw := highWater(t, p, "acct-1"); hw != -1 {
		t.Fatalf("high-water %d after refused owners; want none", hw)
	}
	if recs := r.stub.Submissions(""); len(recs) != 0 {
		t.Fatalf("rail records %+v; want none", recs)
	}
	mustAccept(t, p, strings.Repeat("a", 128), body("po-1", "acct-1", 2500), 42)
}
