package railproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgerr"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
)

// statements records what a pool sends raildb: every statement executed
// and every statement prepared, each one round trip.
type statements struct {
	mu   sync.Mutex
	sent []string
}

func (s *statements) record(kind, sql string) {
	if sql == "-- ping" { // the pool's check of a connection idle for a while
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = append(s.sent, kind+" "+strings.Join(strings.Fields(sql), " "))
}

func (s *statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.record("query", d.SQL)
	return ctx
}

func (s *statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *statements) TracePrepareStart(ctx context.Context, _ *pgx.Conn, d pgx.TracePrepareStartData) context.Context {
	s.record("prepare", d.SQL)
	return ctx
}

func (s *statements) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

func (s *statements) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.sent
	s.sent = nil
	return out
}

// newAdmitProxy returns a Proxy over a fresh raildb whose pool (one
// connection) records what it sends, and the test's own pool.
func newAdmitProxy(t *testing.T) (*Proxy, *statements, *pgxpool.Pool) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.DB.DSN = pgtest.NewDatabase(t)
	cfg.RailURL = "http://127.0.0.1:9" // admit never calls the rail
	cfg.ProofKeys, cfg.ReceiptKey = fencingtest.ProofKeys(), fencingtest.ReceiptSigningKey()
	cfg.TermsKeys = fencingtest.TermsKeys()
	cfg.StallAfter = 0
	p, err := New(t.Context(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	pc := p.pool.Config().Copy()
	pc.MaxConns = 1
	rec := &statements{}
	pc.ConnConfig.Tracer = rec
	traced, err := pgxpool.NewWithConfig(t.Context(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(traced.Close)
	p.pool = traced
	own, err := pgxpool.New(t.Context(), cfg.DB.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(own.Close)
	return p, rec, own
}

func submission(payout string) api.SubmitRequest {
	return api.SubmitRequest{PayoutID: payout, AccountID: "acct-1", AmountMinor: 500, Currency: "EUR"}
}

// The plain accepted admission costs raildb one round trip: no BEGIN, no
// COMMIT, one statement (the second submission is counted, once the
// connection has prepared the statements).
func TestAnAcceptedAdmissionIsOneRoundTrip(t *testing.T) {
	p, rec, _ := newAdmitProxy(t)
	lg := slog.New(slog.DiscardHandler)
	if _, err := p.admit(t.Context(), submission("p-1"), 1, "o", lg); err != nil {
		t.Fatal(err)
	}
	rec.take()
	id, err := p.admit(t.Context(), submission("p-2"), 2, "o", lg)
	if err != nil || id == 0 {
		t.Fatalf("admit = %d, %v; want an attempt id, nil", id, err)
	}
	if sent := rec.take(); len(sent) != 1 {
		t.Errorf("an accepted admission sent raildb %d statements; want 1:\n%s", len(sent), strings.Join(sent, "\n"))
	}
}

// An admission step of a scenario, or a change made behind rail-proxy's
// back.
type admitStep struct {
	payout  string
	token   int64
	sql     string // run instead of a submission
	release string // payout whose forward is recorded not_sent (released)
}

// TestFallbackCasesAnswerAsTheTransactionDoes runs each scenario twice, on
// two fresh raildbs: once through admit (the one-statement path first)
// and once through admitTx alone (the transaction every case ran before),
// and wants the same answer at each step and the same rows after it.
func TestFallbackCasesAnswerAsTheTransactionDoes(t *testing.T) {
	sub := func(payout string, token int64) admitStep { return admitStep{payout: payout, token: token} }
	scenarios := map[string][]admitStep{
		"stale token":                  {sub("p-1", 5), sub("p-2", 3)},
		"equal token, another payout":  {sub("p-1", 5), sub("p-2", 5)},
		"holder's resend":              {sub("p-1", 5), sub("p-1", 5)},
		"second forward, fresh token":  {sub("p-1", 5), sub("p-1", 7), sub("p-2", 7)},
		"second forward, stale token":  {sub("p-1", 5), sub("p-2", 6), sub("p-1", 4)},
		"refused token tried again":    {sub("p-1", 5), sub("p-2", 5), sub("p-2", 5), sub("p-3", 6)},
		"token at the floor, no mark":  {{sql: `UPDATE raildb_identity SET token_floor = 10`}, sub("p-1", 10), sub("p-2", 11)},
		"token at the floor, a mark":   {sub("p-1", 3), {sql: `UPDATE raildb_identity SET token_floor = 10`}, sub("p-2", 9), sub("p-3", 10), sub("p-4", 12)},
		"restored raildb":              {sub("p-1", 5), {sql: `UPDATE raildb_identity SET sequence_oid = sequence_oid + 1`}, sub("p-2", 6), sub("p-1", 6)},
		"forward released, then again": {sub("p-1", 5), {release: "p-1"}, sub("p-1", 6), sub("p-1", 7)},
	}
	for name, steps := range scenarios {
		t.Run(name, func(t *testing.T) {
			var got [2][]string
			for i := range got {
				p, _, own := newAdmitProxy(t)
				admit := p.admit
				if i == 1 {
					admit = p.admitTx
				}
				for _, s := range steps {
					got[i] = append(got[i], runStep(t, p, own, admit, s))
				}
			}
			for k := range steps {
				if got[0][k] != got[1][k] {
					t.Errorf("step %d %+v:\nadmit:   %s\nadmitTx: %s", k, steps[k], got[0][k], got[1][k])
				}
			}
		})
	}
}

type admitFunc func(context.Context, api.SubmitRequest, int64, string, *slog.Logger) (int64, error)

// runStep runs s and describes its answer and raildb's rows after it.
func runStep(t *testing.T, p *Proxy, own *pgxpool.Pool, admit admitFunc, s admitStep) string {
	t.Helper()
	ctx := t.Context()
	var answer string
	switch {
	case s.sql != "":
		if _, err := own.Exec(ctx, s.sql); err != nil {
			t.Fatal(err)
		}
	case s.release != "":
		var id int64
		if err := own.QueryRow(ctx, `SELECT attempt_id FROM rail_payout WHERE payout_id = $1`, s.release).Scan(&id); err != nil {
			t.Fatal(err)
		}
		released, err := p.notSent(ctx, id, s.release)
		if err != nil || !released {
			t.Fatalf("notSent = %v, %v", released, err)
		}
	default:
		id, err := admit(ctx, submission(s.payout), s.token, "o", slog.New(slog.DiscardHandler))
		answer = fmt.Sprintf("attempt %d, %v", id, err)
		switch {
		case errors.Is(err, ErrRestored): // its message names the database
			answer = fmt.Sprintf("attempt %d, %v", id, ErrRestored)
		case err != nil && !errors.Is(err, ErrFencedOut) && !errors.Is(err, ErrAlreadySubmitted):
			t.Fatalf("admit: %v", err)
		}
	}
	var rows string
	err := own.QueryRow(ctx, `SELECT concat_ws(' | ',
  (SELECT string_agg(format('%s %s %s %s', attempt_id, payout_id, token, state), ', ' ORDER BY attempt_id) FROM rail_attempt),
  (SELECT string_agg(format('%s->%s', payout_id, attempt_id), ', ' ORDER BY payout_id) FROM rail_payout),
  (SELECT string_agg(format('%s=%s', account_id, high_water), ', ' ORDER BY account_id) FROM rail_high_water))`).Scan(&rows)
	if err != nil {
		t.Fatal(err)
	}
	return answer + "; rows: " + rows
}

// A forward of the payout committed while the one-statement admission
// waits on rail_payout's key fails that statement, and the submission is
// answered as a second one: nothing of the failed statement stays (no
// second forwarding attempt, the high-water raised once, by the answer).
func TestAnAdmissionRacingAForwardOfItsPayoutIsADuplicate(t *testing.T) {
	p, _, own := newAdmitProxy(t)
	ctx := t.Context()
	tx := begin(t, own)
	var first int64
	if err := tx.QueryRow(ctx, sqlInsertForward, "p-1", "acct-1", int64(3), "first", int64(500), "EUR").Scan(&first, new(bool)); err != nil {
		t.Fatal(err)
	}
	type result struct {
		id  int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		id, err := p.admit(ctx, submission("p-1"), 9, "second", slog.New(slog.DiscardHandler))
		done <- result{id, err}
	}()
	pgtest.AwaitBlockedOnLock(t, ctx, p.pool.Config().ConnString(), done)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	var dup *AlreadySubmitted
	if !errors.As(r.err, &dup) || dup.First.AttemptID != first {
		t.Fatalf("admit = %d, %v; want ErrAlreadySubmitted naming attempt %d", r.id, r.err, first)
	}
	var states string
	var hw int64
	if err := own.QueryRow(ctx, `SELECT string_agg(format('%s %s', owner_id, state), ', ' ORDER BY attempt_id),
  (SELECT high_water FROM rail_high_water WHERE account_id = 'acct-1') FROM rail_attempt`).Scan(&states, &hw); err != nil {
		t.Fatal(err)
	}
	if want := "first forwarding, second duplicate"; states != want || hw != 9 {
		t.Errorf("attempts %q, high-water %d; want %q, 9", states, hw, want)
	}
}

// A one-statement admission raildb runs only after rail-proxy's deadline
// for it (read late, after a freeze) fails and records nothing.
func TestAnAdmissionPastItsDeadlineRecordsNothing(t *testing.T) {
	p, _, own := newAdmitProxy(t)
	req := submission("p-1")
	var id int64
	err := p.pool.QueryRow(t.Context(), sqlAdmitAccepted, req.PayoutID, req.AccountID, int64(5), "o",
		req.AmountMinor, req.Currency, time.Now().Add(-time.Second)).Scan(&id)
	if !pgerr.Is(err, pgerr.DivisionByZero, "") {
		t.Fatalf("statement past its deadline: %d, %v; want SQLSTATE %s", id, err, pgerr.DivisionByZero)
	}
	var rows int
	if err := own.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM rail_attempt) + (SELECT count(*) FROM rail_payout)
  + (SELECT count(*) FROM rail_high_water)`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Errorf("%d rows recorded; want none", rows)
	}
}

// A one-statement admission that waits on a lock until past its deadline
// commits nothing, and the submission is answered by the transaction: the
// deadline is checked after the statement's last wait, and is at most
// half StallAfter after the sending, since the stall breaker may cut a
// call from StallAfter after it started (raildb already marked stalled,
// or the ping failing at once).
func TestAnAdmissionWaitingPastItsDeadlineIsAnsweredByTheTransaction(t *testing.T) {
	p, rec, own := newAdmitProxy(t)
	p.cfg.StallAfter = 200 * time.Millisecond // bounds the deadline; the stall breaker was built off
	ctx := t.Context()
	lg := slog.New(slog.DiscardHandler)
	if _, err := p.admit(ctx, submission("p-1"), 1, "o", lg); err != nil {
		t.Fatal(err)
	}
	tx := begin(t, own)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM rail_high_water WHERE account_id = 'acct-1' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	rec.take()
	type result struct {
		id  int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		id, err := p.admit(ctx, submission("p-2"), 2, "o", lg)
		done <- result{id, err}
	}()
	pgtest.AwaitBlockedOnLock(t, ctx, p.pool.Config().ConnString(), done)
	time.Sleep(p.cfg.StallAfter / 2) // the statement's deadline passes while it waits
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.id == 0 {
		t.Fatalf("admit = %d, %v; want an attempt id, nil", r.id, r.err)
	}
	if sent := rec.take(); !slices.Contains(sent, "query begin") {
		t.Errorf("the admission was not answered by the transaction; raildb was sent:\n%s", strings.Join(sent, "\n"))
	}
	var attempts string
	if err := own.QueryRow(ctx, `SELECT string_agg(format('%s %s %s', attempt_id, token, state), ', ')
  FROM rail_attempt WHERE payout_id = 'p-2'`).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%d 2 forwarding", r.id); attempts != want {
		t.Errorf("p-2's attempts: %q; want %q", attempts, want)
	}
}

// A recovery that commits while a one-statement admission waits for the
// guard's lock decides that admission: the floor is read after the wait,
// not from the snapshot the statement started with.
func TestAnAdmissionWaitingOnARecoveryIsHeldToItsFloor(t *testing.T) {
	p, _, own := newAdmitProxy(t)
	ctx := t.Context()
	tx := begin(t, own)
	if _, err := tx.Exec(ctx, guardLockSQL); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE raildb_identity SET token_floor = 10`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := p.admit(ctx, submission("p-1"), 8, "o", slog.New(slog.DiscardHandler))
		done <- err
	}()
	pgtest.AwaitBlockedOnLock(t, ctx, p.pool.Config().ConnString(), done)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrFencedOut) {
		t.Errorf("admit of token 8 behind a recovery to floor 10: %v; want ErrFencedOut", err)
	}
	var forwards int
	if err := own.QueryRow(ctx, `SELECT count(*) FROM rail_payout`).Scan(&forwards); err != nil {
		t.Fatal(err)
	}
	if forwards != 0 {
		t.Errorf("%d payouts forwarded; want none", forwards)
	}
}

// begin starts a transaction on pool, rolled back when the test ends (a
// no-op after its Commit or Rollback).
func begin(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}
