package pipelinetest_test

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/pipelinetest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	railclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/logtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgpool"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
)

// restoreRig is a reviewer's scenario up to the restore: a
// backup of raildb, holder A leased and claimed p-1 and stalled, its lease
// ended, holder B's redelivery paid p-1, and raildb was restored from the
// backup with pg_restore --clean: its high-water of acct-alice and its
// rail_payout row of p-1 are gone.
type restoreRig struct {
	p        *pipelinetest.Pipeline
	logs     *logtest.Buffer
	ev       payoutevent.Event
	stale    int64 // A's token
	paidWith int64 // the attempt id B's payment got before the restore
}

func startRestoreRig(t *testing.T) *restoreRig {
	t.Helper()
	logs := &logtest.Buffer{}
	p := pipelinetest.Start(t, pipelinetest.Options{Log: slog.New(slog.NewJSONHandler(logs, nil))})
	ev := payoutevent.Event{PayoutID: "p-1", AccountID: "acct-alice", AmountMinor: 2500, Currency: "EUR"}
	if err := p.CreatePayout(t.Context(), ev); err != nil {
		t.Fatal(err)
	}
	dump := filepath.Join(t.TempDir(), "raildb.dump")
	pgtest.RunTool(t, "pg_dump", "--format=custom", "--file="+dump, "--dbname="+p.RailDB.Config().ConnString())

	// A: leased and claimed, then stalls; its lease ends on the server.
	locks, err := client.New(p.LockURL)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := locks.Acquire(t.Context(), ev.LockKey(), client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	stale := lease.Token()
	if status, body := send(t, p.PayURL+"/v1/payouts/p-1/claim", ev.AccountID, stale, nil); status != http.StatusOK {
		t.Fatalf("claim: %d %s", status, body)
	}
	p.LockClock.Advance(2 * time.Minute)

	// B: the redelivery pays the payout.
	if out, _, err := deliver(t, newExecutor(t, p, "B", nil), ev, 3); err != nil || out != executor.OutcomePosted {
		t.Fatalf("B: %q %v", out, err)
	}
	var paidWith int64
	if err := p.RailDB.QueryRow(t.Context(), `SELECT attempt_id FROM rail_payout WHERE payout_id = 'p-1'`).Scan(&paidWith); err != nil {
		t.Fatal(err)
	}
	// raildb is restored from the backup.
	p.RailDB.Reset()
	pgtest.RunTool(t, "pg_restore", "--clean", "--no-owner", "--exit-on-error", "--dbname="+p.RailDB.Config().ConnString(), dump)
	var forwarded int
	if err := p.RailDB.QueryRow(t.Context(), `SELECT count(*) FROM rail_payout`).Scan(&forwarded); err != nil {
		t.Fatal(err)
	}
	if forwarded != 0 {
		t.Fatalf("the restored raildb knows %d forwarded payout(s); the scenario needs it to have forgotten p-1", forwarded)
	}
	return &restoreRig{p: p, logs: logs, ev: ev, stale: stale, paidWith: paidWith}
}

// submit sends ev with token to rail-proxy, its terms signed as
// payment-resource would sign them.
func (r *restoreRig) submit(t *testing.T, token int64, payout, account string) (railapi.SubmitAnswer, error) {
	t.Helper()
	return r.p.Rail.Submit(t.Context(), fencingtest.Holder(account, token, "review"), signed(railapi.SubmitRequest{
		PayoutID: payout, AccountID: account, AmountMinor: r.ev.AmountMinor, Currency: r.ev.Currency}))
}

// refusal returns err's *railclient.Error (a zero one when err is not).
func refusal(err error) railclient.Error {
	var e *railclient.Error
	if errors.As(err, &e) {
		return *e
	}
	return railclient.Error{}
}

// count returns one integer from raildb.
func count(t *testing.T, db *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow(t.Context(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// writeJournal writes the rail's journal as its GET /submissions serves it.
func writeJournal(t *testing.T, stub *railstub.Stub) string {
	t.Helper()
	raw, err := json.Marshal(rail.SubmissionList{Submissions: stub.Submissions("")})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "rail-journal.json")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// recoverRestore runs the operator's recovery as "rail-proxy
// recover-restore --past n --rail-journal FILE" does.
func (r *restoreRig) recoverRestore(t *testing.T, n int64) railproxy.RestoreRecovered {
	t.Helper()
	f, err := os.Open(writeJournal(t, r.p.Stub))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	journal, err := railproxy.ReadRailJournal(f)
	if err != nil {
		t.Fatal(err)
	}
	out, err := railproxy.RecoverRestore(t.Context(), pgpool.Config{DSN: r.p.RailDB.Config().ConnString()},
		railproxy.RestoreRecovery{Past: n, Journal: journal}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("recover-restore --past %d: %v", n, err)
	}
	t.Logf("recover-restore --past %d: %+v", n, out)
	return out
}

// Finding 4 (money moves twice after a raildb restore), fixed. The
// one-forward rule and the high-water live only in raildb. A stale holder
// that claimed before the new holder paid submits after raildb was
// restored from a backup taken before that payment: both its rail_payout
// row and the account's high-water are gone. The restore guard refuses
// every submission (503 RAILDB_RESTORED, retryable, nothing recorded)
// until the operator's recovery has rebuilt from the rail's journal what
// went to the rail and set the token floor N; after it the stale holder
// is fenced, a second submission of p-1 is refused with the rebuilt
// attempt, and a new payout with a token above N goes through once.
func TestRaildbRestoreDoesNotLetASecondSubmissionThrough(t *testing.T) {
	r := startRestoreRig(t)
	p, ev := r.p, r.ev

	// A wakes up and submits: refused, nothing recorded, rail not called.
	attemptsBefore := count(t, p.RailDB, `SELECT count(*) FROM rail_attempt`)
	_, err := r.submit(t, r.stale, ev.PayoutID, ev.AccountID)
	t.Logf("A's submission with token %d after the restore: %v", r.stale, err)
	if e := refusal(err); !errors.Is(err, railclient.ErrRaildbRestored) || e.Status != http.StatusServiceUnavailable || !e.Retryable {
		t.Errorf("A after the restore: %v; want 503 %s, retryable", err, railapi.CodeRestored)
	}
	if n := len(p.Stub.Submissions(ev.PayoutID)); n != 1 {
		t.Fatalf("the rail received p-1 %d times; want once", n)
	}
	if n := count(t, p.RailDB, `SELECT count(*) FROM rail_attempt`); n != attemptsBefore {
		t.Errorf("the refused submission recorded %d attempt(s); want none", n-attemptsBefore)
	}
	if ev := r.logs.Events(t, "raildb_restored"); len(ev) == 0 || ev[0]["level"] != "ERROR" {
		t.Errorf("log events raildb_restored: %v; want one at ERROR", ev)
	}
	// A new payout's delivery is refused too, and redelivered later.
	ev2 := payoutevent.Event{PayoutID: "p-2", AccountID: "acct-alice", AmountMinor: 700, Currency: "EUR"}
	if err := p.CreatePayout(t.Context(), ev2); err != nil {
		t.Fatal(err)
	}
	x := newExecutor(t, p, "C", nil)
	if out, err := x.Execute(t.Context(), ev2); executor.Status(out, err) != http.StatusServiceUnavailable {
		t.Errorf("p-2 before the recovery: %q %v; want 503 (redelivered)", out, err)
	}
	if n := len(p.Stub.Submissions(ev2.PayoutID)); n != 0 {
		t.Errorf("the rail received p-2 %d times before the recovery; want none", n)
	}
	// The reads keep answering.
	if _, err := p.Rail.Attempts(t.Context(), ev.PayoutID); err != nil {
		t.Errorf("GET attempts on a restored raildb: %v; want 200", err)
	}

	// The operator's recovery. N: the largest token issued before the
	// restore; here the largest token paydb's fence accepted (B's), which
	// is also at least A's.
	n := count(t, p.PayDB, `SELECT max(fence) FROM account`)
	if n < r.stale {
		t.Fatalf("N %d is below A's token %d", n, r.stale)
	}
	rec := r.recoverRestore(t, n)
	rebuilt := railapi.Attempt{AttemptID: -1}
	if len(rec.Rebuilt) == 1 {
		rebuilt = rec.Rebuilt[0]
	}
	if rebuilt.PayoutID != ev.PayoutID || rec.TokenFloor != n {
		t.Errorf("recovery %+v; want p-1 rebuilt and token floor %d", rec, n)
	}

	// A (token <= N) is fenced, on its account and on one raildb has no
	// high-water for.
	for _, acct := range []string{ev.AccountID, "acct-new"} {
		_, err := r.submit(t, r.stale, ev.PayoutID, acct)
		if !errors.Is(err, railclient.ErrFencedOut) || refusal(err).Status != http.StatusConflict {
			t.Errorf("A on %s after the recovery: %v; want 409 %s", acct, err, railapi.CodeFencedOut)
		}
	}
	var highest []float64
	for _, e := range r.logs.Events(t, fencewire.EventFencedOut) {
		highest = append(highest, e["highestToken"].(float64))
	}
	if len(highest) != 2 || highest[0] != float64(n) || highest[1] != float64(n) {
		t.Errorf("fenced_out highestToken %v; want [%d %d] (the token floor)", highest, n, n)
	}

	// A second submission of p-1 by a holder with a fresh token is
	// refused with the rebuilt attempt.
	locks, err := client.New(p.LockURL)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := locks.Acquire(t.Context(), ev.LockKey(), client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if lease.Token() <= n {
		t.Fatalf("fresh token %d not above N %d", lease.Token(), n)
	}
	_, err = r.submit(t, lease.Token(), ev.PayoutID, ev.AccountID)
	dup := refusal(err)
	if !errors.Is(err, railclient.ErrAlreadySubmitted) || dup.Status != http.StatusConflict || dup.Attempt == nil {
		t.Fatalf("second submission of p-1 with token %d: %v; want 409 %s", lease.Token(), err, railapi.CodeAlreadySubmitted)
	}
	railRef := p.Stub.Submissions(ev.PayoutID)[0].Answer.RailRef
	if a := dup.Attempt; a.AttemptID != rebuilt.AttemptID || a.State != railapi.StateAcked || a.RailRef != railRef ||
		a.Token != n || a.OwnerID != railapi.RebuiltOwner {
		t.Errorf("refused with attempt %+v; want the rebuilt one (acked %s, token %d)", a, railRef, n)
	}
	if err := lease.Release(t.Context()); err != nil {
		t.Fatal(err)
	}

	// p-2, redelivered, goes through once, with a token above N and an
	// attempt id no attempt had before the restore.
	if out, _, err := deliver(t, x, ev2, 3); err != nil || out != executor.OutcomePosted {
		t.Fatalf("p-2 after the recovery: %q %v; want posted", out, err)
	}
	if got := len(p.Stub.Submissions(ev2.PayoutID)); got != 1 {
		t.Errorf("the rail received p-2 %d times; want once", got)
	}
	if got := len(p.Stub.Submissions(ev.PayoutID)); got != 1 {
		t.Errorf("the rail received p-1 %d times; want once", got)
	}
	rep, err := p.Audit(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("audit after the recovery: balanced %v, violations %v", rep.Balanced, rep.Violations)
	id := count(t, p.RailDB, `SELECT attempt_id FROM rail_payout WHERE payout_id = 'p-2'`)
	if id <= rec.AttemptIDsAbove || id <= r.paidWith || rebuilt.AttemptID <= r.paidWith {
		t.Errorf("attempt ids after the recovery: p-2 %d, rebuilt p-1 %d; want both above %d (B's attempt before the restore was %d)",
			id, rebuilt.AttemptID, rec.AttemptIDsAbove, r.paidWith)
	}
}

// The check can fail: the same restore with the guard's stamp rewritten
// to match the restored database (the guard blinded, as an operator who
// "fixes" the stamp by hand would) lets A's stale submission through to
// the rail a second time.
func TestRaildbRestoreWithTheGuardBlindedPaysTwice(t *testing.T) {
	r := startRestoreRig(t)
	if _, err := r.p.RailDB.Exec(t.Context(), `UPDATE raildb_identity i SET sequence_oid = c.sequence_oid, database_oid = c.database_oid,
    timeline_id = c.timeline_id, system_identifier = c.system_identifier FROM raildb_current_identity() c`); err != nil {
		t.Fatal(err)
	}
	ans, err := r.submit(t, r.stale, r.ev.PayoutID, r.ev.AccountID)
	t.Logf("A's submission with token %d, guard blinded: %+v, %v", r.stale, ans, err)
	if n := len(r.p.Stub.Submissions(r.ev.PayoutID)); n != 2 {
		t.Errorf("the rail received p-1 %d times; want twice (without the guard the restore lets A through)", n)
	}
}
