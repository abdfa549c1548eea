package railproxy_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgpool"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
)

// Reads that decide a later write, inside admit's transaction (audit 7).

// TestARefusedSubmissionDoesNotMakeTheNextOneOwn: a token equal to the
// high-water mark passes only as its holder's resend of its own
// submission. The fence's refusal of that token for another payout writes
// an audit row ('fenced') that must decide nothing later: before the fix,
// the own-resend check (sqlOwnEarlierAttempt) counted it, so the second
// try of the same token on the other payout was forwarded to the rail.
func TestARefusedSubmissionDoesNotMakeTheNextOneOwn(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	mustAccept(t, p, "worker-a", body("po-1", "acct-1", 100), 42)
	for try := range 3 {
		rec := submit(p, "worker-x", body("po-2", "acct-1", 100), "42")
		if rec.Code != http.StatusConflict {
			t.Fatalf("try %d of token 42 on po-2: %d %s; want 409 %s (one grant, one payout)", try+1, rec.Code, rec.Body, api.CodeFencedOut)
		}
		mustBeFenced(t, rec)
	}
	if got := r.stub.Submissions("po-2"); len(got) != 0 {
		t.Fatalf("rail records %d submissions of po-2; want none", len(got))
	}
	if got := r.logs.Events(t, fencewire.EventFencedOut); len(got) != 3 {
		t.Fatalf("%d fenced_out lines; want 3", len(got))
	}
	// The holder's own resend of po-1 is still not stale.
	mustBeDuplicate(t, submit(p, "worker-a", body("po-1", "acct-1", 100), "42"))
}

// TestAForwardReleasedWhileBeingReadIsNotAnAlreadySubmittedPayout: a
// submission finds the payout's forward held (the insert into rail_payout
// conflicts) and reads that forward FOR UPDATE; meanwhile the forward's own
// proxy records it not_sent and releases it (notSent: the UPDATE, then the
// DELETE, in one transaction). The read waits for that transaction and
// then returns the attempt as not_sent. Before the fix, the submission was
// refused PAYOUT_ALREADY_SUBMITTED with a not_sent attempt that no longer
// held the payout: the executor reported AMBIGUOUS and the reconciler
// failed a payout that nothing had paid and nothing held.
func TestAForwardReleasedWhileBeingReadIsNotAnAlreadySubmittedPayout(t *testing.T) {
	r := newRig(t)
	p := r.proxy(func(c *railproxy.Config) { c.DBTimeout = 20 * time.Second })
	ctx := t.Context()
	x := r.forwardingAttempt("po-1", 41, 0)

	// The first half of notSent's transaction, held open.
	tx, err := r.pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if tag, err := tx.Exec(ctx, `UPDATE rail_attempt SET state = 'not_sent', finished_at = now() WHERE attempt_id = $1 AND state = 'forwarding'`, x); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("not_sent update: %v %v", tag, err)
	}

	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- submit(p, "worker-b", body("po-1", "acct-1", 700), "42") }()
	pgtest.AwaitBlockedOnLock(t, ctx, r.dsn, done)

	// The second half: the forward released, committed.
	if _, err := tx.Exec(ctx, `DELETE FROM rail_payout WHERE payout_id = $1 AND attempt_id = $2`, "po-1", x); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var rec *httptest.ResponseRecorder
	select {
	case rec = <-done:
	case <-ctx.Done():
		t.Fatal("the submission never answered")
	}
	var ans api.SubmitAnswer
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &ans) != nil || ans.Status != api.RailAck {
		t.Fatalf("submission of po-1 after its forward was released: %d %s; want 200 ACK (nothing held the payout)", rec.Code, rec.Body)
	}
	if got := r.stub.Submissions("po-1"); len(got) != 1 {
		t.Fatalf("rail records %d submissions of po-1; want 1", len(got))
	}
	// Exactly one forward, the new one, and nothing else of po-1 passes.
	mustBeDuplicate(t, submit(p, "worker-c", body("po-1", "acct-1", 700), "43"))
	if got := r.stub.Submissions("po-1"); len(got) != 1 {
		t.Fatalf("rail records %d submissions of po-1; want 1", len(got))
	}
}

// TestClosingAPayoutIsRefusedOnARestoredRaildb: closing a payout that has
// no forward records an attempt, and "no forward" is read from raildb. On
// a restored raildb (before rail-proxy recover-restore) that read may be
// the backup's, and the attempt id the restored sequence hands out may
// already have named another attempt in logs and answers. The closing
// transaction checks the restore guard as a submission's does: 503
// RAILDB_RESTORED, nothing recorded, no stop order.
func TestClosingAPayoutIsRefusedOnARestoredRaildb(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	if _, err := r.pool().Exec(t.Context(), `UPDATE raildb_identity SET sequence_oid = sequence_oid + 1`); err != nil {
		t.Fatal(err)
	}
	req := api.ReconcileRequest{PayoutID: "g-1", AccountID: "acct-g", AmountMinor: 500, Currency: "EUR"}
	req.BodyTermsSignature = fencingtest.Terms(api.SubmitRequest(req).Terms()) // reconcileAs sends it in its header
	b, _ := json.Marshal(req)
	rec := reconcileAs(p, "acct-g", 7, string(b))
	if e := envelope(t, rec); rec.Code != http.StatusServiceUnavailable || e.Code != api.CodeRestored || !e.Retryable {
		t.Fatalf("closing g-1 on a restored raildb: %d %s; want 503 %s, retryable", rec.Code, rec.Body, api.CodeRestored)
	}
	if n := r.attemptRows(); n != 0 {
		t.Fatalf("%d attempt rows; want none", n)
	}
	// No stop order reached the rail: the payout can still be paid.
	if _, err := railproxy.RecoverRestore(t.Context(), pgpool.Config{DSN: r.dsn}, railproxy.RestoreRecovery{Past: 6}, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if ans := mustAccept(t, p, "w", body("g-1", "acct-g", 500), 8); ans.Status != api.RailAck {
		t.Fatalf("g-1 after the recovery: %+v; want ACK", ans)
	}
}
