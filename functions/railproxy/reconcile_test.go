package railproxy_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/prooftest"
)

// reconcileAs posts a reconciliation of body (a ReconcileRequest) as the
// holder of token on account's lock, with lock-server's proof of it.
func reconcileAs(h http.Handler, account string, token int64, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("POST", api.PathReconciliations, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(fencing.HeaderToken, strconv.FormatInt(token, 10))
	req.Header.Set(fencing.HeaderProof, prooftest.Proof(account, token))
	req.Header.Set(fencing.HeaderOwner, "reconciler")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// forwardingAttempt records, by hand, a forwarded attempt of payout on
// acct-1 that stayed forwarding (its proxy died before the rail's answer
// was recorded), created age ago.
func (r *rig) forwardingAttempt(payout string, token int64, age time.Duration) int64 {
	r.t.Helper()
	ctx := r.t.Context()
	var id int64
	if err := r.pool().QueryRow(ctx, `INSERT INTO rail_attempt (payout_id, account_id, token, amount_minor, currency, state, created_at)
VALUES ($1, 'acct-1', $2, 700, 'EUR', 'forwarding', now() - $3::bigint * interval '1 millisecond') RETURNING attempt_id`,
		payout, token, age.Milliseconds()).Scan(&id); err != nil {
		r.t.Fatal(err)
	}
	if _, err := r.pool().Exec(ctx, `INSERT INTO rail_payout (payout_id, attempt_id) VALUES ($1, $2)`, payout, id); err != nil {
		r.t.Fatal(err)
	}
	return id
}

// TestReconciliationWithTheRailDownDoesNotClaimNothingReachedIt (probe
// 10): with the rail dead, a reconciliation's stop order gets no answer:
// 503 UNAVAILABLE, retryable, nothing recorded, and the message must not
// promise that nothing reached the rail (the payout's forward may have).
func TestReconciliationWithTheRailDownDoesNotClaimNothingReachedIt(t *testing.T) {
	r := newRig(t)
	p := r.proxy(func(c *railproxy.Config) {
		c.RailURL = deadURL(t)
		c.RailTimeout, c.DBTimeout = time.Second, time.Second
	})
	r.forwardingAttempt("po-1", 5, time.Minute)
	rec := reconcileAs(p, "acct-1", 6, `{"payoutId":"po-1"}`)
	e := envelope(t, rec)
	if rec.Code != http.StatusServiceUnavailable || e.Code != api.CodeUnavailable || !e.Retryable {
		t.Fatalf("answer %d %s; want 503 %s, retryable", rec.Code, rec.Body, api.CodeUnavailable)
	}
	if strings.Contains(e.Message, "nothing reached the rail") {
		t.Fatalf("message %q claims nothing reached the rail", e.Message)
	}
	if got := r.attemptStates(); got[api.StateForwarding] != 1 || len(got) != 1 {
		t.Fatalf("attempt states %v; want the one forwarding attempt unchanged", got)
	}
}

func decode[T any](t *testing.T, rec *httptest.ResponseRecorder) T {
	t.Helper()
	var v T
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &v) != nil {
		t.Fatalf("answer %d %s; want 200 with a body", rec.Code, rec.Body)
	}
	return v
}
