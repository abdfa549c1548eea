package railproxy_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgpool"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
)

// mustBeRestored checks a 503 RAILDB_RESTORED, retryable.
func mustBeRestored(t *testing.T, h http.Handler, b string, token string) {
	t.Helper()
	rec := submit(h, "w", b, token)
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("token %s: status %d, body %s; want 503", token, rec.Code, rec.Body)
	}
	if e := envelope(t, rec); e.Code != api.CodeRestored || !e.Retryable {
		t.Fatalf("envelope %+v; want %s, retryable", e, api.CodeRestored)
	}
}

// A restart of raildb's PostgreSQL (fast shutdown, and a crash with
// recovery from the WAL) and of rail-proxy is not a restore: the same
// system, timeline, database and sequence, so submissions are admitted
// and the high-water is kept.
func TestRaildbRestartIsNotARestore(t *testing.T) {
	r := newRig(t)
	c := pgtest.NewCluster(t)
	r.dsn = c.DSN("postgres")
	first := r.proxy(nil)
	mustAccept(t, first, "w", body("po-1", "acct-1", 100), 10)
	_ = first.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	second := r.proxy(nil)
	mustBeFenced(t, submit(second, "w", body("po-2", "acct-1", 100), "10"))
	mustAccept(t, second, "w", body("po-3", "acct-1", 100), 11)
	_ = second.Close()

	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	third := r.proxy(nil)
	mustBeFenced(t, submit(third, "w", body("po-4", "acct-1", 100), "11"))
	mustAccept(t, third, "w", body("po-5", "acct-1", 100), 12)
	if n := len(r.logs.Events(t, api.EventRaildbRestored)); n != 0 {
		t.Errorf("%d raildb_restored events after plain restarts; want none", n)
	}
}

// A changed identity (here: the stamp says another sequence, as after a
// pg_restore --clean) refuses every submission, records nothing and calls
// no rail; the reads still answer. The recovery admits them again, with
// the token floor applied to every account.
func TestRestoredRaildbRefusesUntilRecovered(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	mustAccept(t, p, "w", body("po-1", "acct-1", 100), 5)
	if _, err := r.pool().Exec(t.Context(), `UPDATE raildb_identity SET sequence_oid = sequence_oid + 1`); err != nil {
		t.Fatal(err)
	}
	before := r.attemptRows()
	mustBeRestored(t, p, body("po-2", "acct-2", 100), "100")
	if n := r.attemptRows(); n != before {
		t.Errorf("the refusal recorded %d attempt(s); want none", n-before)
	}
	if n := len(r.stub.Submissions("")); n != 1 {
		t.Errorf("the rail received %d submissions; want 1", n)
	}
	if ev := r.logs.Events(t, api.EventRaildbRestored); len(ev) != 1 || ev[0]["level"] != "ERROR" {
		t.Errorf("raildb_restored events %v; want one at ERROR", ev)
	}
	if hw := highWater(t, p, "acct-1"); hw != 5 {
		t.Errorf("GET high-water on a restored raildb: %d; want 5", hw)
	}

	out, err := railproxy.RecoverRestore(t.Context(), pgpool.Config{DSN: r.dsn}, railproxy.RestoreRecovery{Past: 50}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if out.TokenFloor != 50 || out.Previous == "" || out.Previous == out.Identity || out.AttemptIDsAbove < railproxy.AttemptIDGap {
		t.Errorf("recovered %+v; want floor 50, a new identity, attempt ids above %d", out, int64(railproxy.AttemptIDGap))
	}
	// Floor: refused for an account without a row and one below it.
	for _, acct := range []string{"acct-1", "acct-new"} {
		mustBeFenced(t, submit(p, "w", body("po-3", acct, 100), "50"))
	}
	if ev := r.logs.Events(t, fencewire.EventFencedOut); len(ev) != 2 || ev[1]["highestToken"] != float64(50) {
		t.Errorf("fenced_out events %v; want 2 with highestToken 50", ev)
	}
	ans := mustAccept(t, p, "w", body("po-3", "acct-new", 100), 51)
	if ans.AttemptID <= out.AttemptIDsAbove {
		t.Errorf("attempt id %d after the recovery; want above %d", ans.AttemptID, out.AttemptIDsAbove)
	}
	// The strict per-account high-water still holds above the floor.
	mustBeFenced(t, submit(p, "w", body("po-4", "acct-new", 100), "51"))
}

// PostgreSQL keeps the guard's plans for the session, so a session that
// ran the check before rail_attempt's id sequence was recreated (back at
// 1, as a restore takes it back) must see the new sequence at the next
// submission. rail-proxy's pool has one connection, open throughout.
func TestAttemptIDSequenceRecreatedUnderALiveSessionRefuses(t *testing.T) {
	r := newRig(t)
	const app = "railproxy-live-session"
	u, err := url.Parse(r.dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	p := r.proxy(func(c *railproxy.Config) { c.DB.DSN, c.DB.MaxConns = u.String(), 1 })
	sessions := func() (pids string) {
		t.Helper()
		err := r.pool().QueryRow(t.Context(), `SELECT coalesce(string_agg(pid::text, ','), '') FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&pids)
		if err != nil {
			t.Fatal(err)
		}
		return pids
	}
	mustAccept(t, p, "w", body("po-1", "acct-1", 100), 5)
	mustAccept(t, p, "w", body("po-2", "acct-2", 100), 5)
	before := sessions()

	if _, err := r.pool().Exec(t.Context(), `ALTER TABLE rail_attempt ALTER attempt_id DROP DEFAULT;
DROP SEQUENCE rail_attempt_attempt_id_seq;
CREATE SEQUENCE rail_attempt_attempt_id_seq OWNED BY rail_attempt.attempt_id;
ALTER TABLE rail_attempt ALTER attempt_id SET DEFAULT nextval('rail_attempt_attempt_id_seq')`); err != nil {
		t.Fatal(err)
	}
	mustBeRestored(t, p, body("po-3", "acct-1", 100), "6")
	if after := sessions(); after != before || strings.Contains(before, ",") {
		t.Fatalf("rail-proxy's sessions: %q before, %q after; want the one session that ran the check before", before, after)
	}
}

// The recovery rebuilds each payout of the rail's journal that raildb does
// not know went to the rail, once: run twice, it adds nothing, lowers no
// floor, and only moves attempt ids further on.
func TestRecoverRestoreRebuildsFromTheJournalOnce(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	known := mustAccept(t, p, "w", body("po-known", "acct-1", 100), 5)
	journal := []railproxy.RailRecord{
		{PayoutID: "po-known", AccountID: "acct-1", AmountMinor: 100, Currency: "EUR", Status: api.RailAck, RailRef: known.RailRef},
		{PayoutID: "po-lost", AccountID: "acct-2", AmountMinor: 300, Currency: "EUR", Status: api.RailAck, RailRef: "rail-900001"},
		{PayoutID: "po-declined", AccountID: "acct-2", AmountMinor: 9, Currency: "EUR", Status: api.RailDecline, RailRef: "rail-900002"},
		{PayoutID: "po-lost", AccountID: "acct-2", AmountMinor: 300, Currency: "EUR", Status: api.RailAck, RailRef: "rail-900003"},
	}
	db := pgpool.Config{DSN: r.dsn}
	log := slog.New(slog.DiscardHandler)
	first, err := railproxy.RecoverRestore(t.Context(), db, railproxy.RestoreRecovery{Past: 40, Journal: journal}, log)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range first.Rebuilt {
		got = append(got, a.PayoutID+"/"+string(a.State)+"/"+a.RailRef)
		if a.Token != 40 || a.OwnerID != api.RebuiltOwner || a.AttemptID <= first.AttemptIDsAbove {
			t.Errorf("rebuilt %+v; want token 40, owner %q, id above %d", a, api.RebuiltOwner, first.AttemptIDsAbove)
		}
	}
	want := "po-lost/acked/rail-900001 po-declined/declined/rail-900002 po-lost/acked/rail-900003"
	if strings.Join(got, " ") != want {
		t.Errorf("rebuilt %v; want %s", got, want)
	}
	// po-lost's forward is its first rail submission.
	dup := mustBeDuplicate(t, submit(p, "w", body("po-lost", "acct-2", 300), "41"))
	if dup.Attempt.RailRef != "rail-900001" {
		t.Errorf("po-lost refused with %+v; want its first rail submission", dup.Attempt)
	}

	rows := r.attemptRows()
	second, err := railproxy.RecoverRestore(t.Context(), db, railproxy.RestoreRecovery{Past: 30, Journal: journal}, log)
	if err != nil {
		t.Fatal(err)
	}
	if len(second.Rebuilt) != 0 || r.attemptRows() != rows || second.TokenFloor != 40 || second.AttemptIDsAbove <= first.AttemptIDsAbove {
		t.Errorf("second run %+v (%d attempts, were %d); want nothing rebuilt, floor kept at 40, ids moved on", second, r.attemptRows(), rows)
	}
	if n := len(r.stub.Submissions("")); n != 1 {
		t.Errorf("the rail received %d submissions; want 1 (the recovery calls no rail)", n)
	}
}

// Bad input to the recovery changes nothing: the stamp, the floor, the
// attempts and the sequence stay as they were.
func TestRecoverRestoreBadInputChangesNothing(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	mustAccept(t, p, "w", body("po-1", "acct-1", 100), 5)
	if _, err := r.pool().Exec(t.Context(), `UPDATE raildb_identity SET sequence_oid = sequence_oid + 1`); err != nil {
		t.Fatal(err)
	}
	snapshot := func() string {
		var s string
		if err := r.pool().QueryRow(t.Context(), `SELECT format('%s|%s|%s|%s', i.sequence_oid, i.token_floor,
       (SELECT count(*) FROM rail_attempt), (SELECT last_value FROM rail_attempt_attempt_id_seq)) FROM raildb_identity i`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := snapshot()
	good := railproxy.RailRecord{PayoutID: "po-2", AccountID: "acct-2", AmountMinor: 1, Currency: "EUR", Status: api.RailAck, RailRef: "rail-1"}
	bad := good
	bad.Status = "MAYBE"
	for name, rec := range map[string]railproxy.RestoreRecovery{
		"past-zero":          {Past: 0, Journal: []railproxy.RailRecord{good}},
		"past-negative":      {Past: -3},
		"past-above-2^53":    {Past: railproxy.MaxRecoverPast + 1},
		"attempt-ids-past<0": {Past: 10, AttemptIDsPast: -1},
		"bad-record":         {Past: 10, Journal: []railproxy.RailRecord{good, bad}},
	} {
		_, err := railproxy.RecoverRestore(t.Context(), pgpool.Config{DSN: r.dsn}, rec, slog.New(slog.DiscardHandler))
		if !errors.Is(err, railproxy.ErrInvalidRecovery) {
			t.Errorf("%s: %v; want ErrInvalidRecovery", name, err)
		}
	}
	if after := snapshot(); after != before {
		t.Errorf("raildb changed from %s to %s", before, after)
	}
	mustBeRestored(t, p, body("po-3", "acct-1", 100), "6")
}

func TestReadRailJournal(t *testing.T) {
	ok := `{"submissions":[{"seq":1,"request":{"payoutId":"p-1","accountId":"a-1","amountMinor":5,"currency":"EUR","reference":"p-1"},
	"answer":{"status":"ACK","railRef":"rail-000001"},"withheld":true}]}`
	recs, err := railproxy.ReadRailJournal(strings.NewReader(ok))
	want := railproxy.RailRecord{PayoutID: "p-1", AccountID: "a-1", AmountMinor: 5, Currency: "EUR", Status: "ACK", RailRef: "rail-000001"}
	if err != nil || len(recs) != 1 || recs[0] != want {
		t.Fatalf("ReadRailJournal: %+v %v; want [%+v]", recs, err, want)
	}
	for name, in := range map[string]string{
		"not-json":       `{"submissions":`,
		"no-submissions": `{"items":[]}`,
		"no-answer":      `{"submissions":[{"request":{"payoutId":"p-1","accountId":"a-1","amountMinor":5,"currency":"EUR"}}]}`,
		"bad-amount":     `{"submissions":[{"request":{"payoutId":"p-1","accountId":"a-1","amountMinor":0,"currency":"EUR"},"answer":{"status":"ACK","railRef":"r"}}]}`,
	} {
		if _, err := railproxy.ReadRailJournal(strings.NewReader(in)); !errors.Is(err, railproxy.ErrInvalidRecovery) {
			t.Errorf("%s: %v; want ErrInvalidRecovery", name, err)
		}
	}
}

// A backup older than the guard restored with pg_restore --clean over a
// raildb that has it: goose's version table goes back to 2 (every later
// version goes with it) while raildb_identity stays, with a stamp that no
// longer matches. The
// recovery re-applies migration 00003 without failing on what exists, and
// re-stamps.
func TestRecoverRestoreAfterABackupOlderThanTheGuard(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	if _, err := r.pool().Exec(t.Context(), `UPDATE raildb_identity SET sequence_oid = sequence_oid + 1;
DELETE FROM railproxy_goose_version WHERE version_id >= 3`); err != nil {
		t.Fatal(err)
	}
	mustBeRestored(t, p, body("po-1", "acct-1", 100), "5")
	out, err := railproxy.RecoverRestore(t.Context(), pgpool.Config{DSN: r.dsn}, railproxy.RestoreRecovery{Past: 9}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("recovery: %v", err)
	}
	if out.Previous == out.Identity {
		t.Errorf("recovered %+v; want a new stamp", out)
	}
	mustAccept(t, p, "w", body("po-1", "acct-1", 100), 10)
}
