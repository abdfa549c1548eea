package e2e_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor/fault"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/logtest"
)

// TestPauseFaultMakesAStaleDeliveryTheFencesRefuse is the game day's stale
// worker (docs/cloud.md) on the real fences, with both on: one executor,
// as on Cloud Run, armed with the pause fault through its environment
// variables; delivery 1 of the payout pauses after its last lease
// confirmation for real time, its lease expires on lock-server's clock,
// delivery 2 takes over and posts; delivery 1 wakes with its stale token
// and rail-proxy's fence refuses it. The rail receives the payout once and
// the books balance.
func TestPauseFaultMakesAStaleDeliveryTheFencesRefuse(t *testing.T) {
	ctx := begin(t, "PostgreSQL", 2*time.Minute)
	var logs logtest.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	st := newStack(ctx, t, log, lockStores(ctx, t)["postgres"], fences{payment: true, rail: true})
	ev := payoutevent.Event{PayoutID: "gameday-p-1", AccountID: "acct-7", AmountMinor: 2500, Currency: "EUR"}
	createPayout(t, st, ev)

	// The pause is real time: long enough for the lease (1 s) to expire and
	// delivery 2 to finish on a loaded machine; the test checks the order.
	env := map[string]string{
		"LOCK_SERVER_URL": st.lockURL, executor.EnvPaymentResourceURL: st.pay, executor.EnvRailProxyURL: st.proxy,
		executor.EnvOwner: "worker", executor.EnvLeaseTTLMs: "1000",
		fault.EnvPauseMs: "8000", fault.EnvPausePayoutPrefix: "gameday-",
	}
	getenv := func(k string) string { return env[k] }
	cfg, err := executor.LoadConfig(getenv)
	if err != nil {
		t.Fatal(err)
	}
	f, err := fault.FromEnv(getenv, cfg.LeaseTTL, log.With("service", "executor"))
	if err != nil {
		t.Fatal(err)
	}
	x, err := executor.New(cfg, log.With("service", "executor"), executor.WithFault(f))
	if err != nil {
		t.Fatal(err)
	}
	// Its lease releases follow the push answers: wait for the last ones.
	t.Cleanup(func() { _ = x.Close(context.Background()) })
	deliver := func(attempt int) *httptest.ResponseRecorder {
		body, err := payoutevent.Encode(ev, "m-1", ev.AccountID, attempt)
		if err != nil {
			t.Error(err)
		}
		rec := httptest.NewRecorder()
		x.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodPost, "/", bytes.NewReader(body)))
		return rec
	}
	answer1 := make(chan *httptest.ResponseRecorder, 1)
	go func() { answer1 <- deliver(1) }()
	started := awaitEvent(ctx, t, &logs, "fault_pause_started")
	tokenA := int64(started["token"].(float64))
	awaitLeaseGone(ctx, t, st, ev, tokenA)

	rec2 := deliver(2)
	select {
	case rec1 := <-answer1:
		t.Fatalf("delivery 1 answered %d %s before delivery 2 finished: the pause was too short for this machine", rec1.Code, rec1.Body)
	default:
	}
	if rec2.Code != http.StatusOK || !strings.Contains(rec2.Body.String(), `"posted"`) {
		t.Fatalf("delivery 2 answered %d %s; want 200 posted", rec2.Code, rec2.Body)
	}
	var rec1 *httptest.ResponseRecorder
	select {
	case rec1 = <-answer1:
	case <-ctx.Done():
		t.Fatal("delivery 1 never answered")
	}
	if rec1.Code != http.StatusConflict {
		t.Errorf("delivery 1 answered %d %s; want 409 (fenced out, redelivered)", rec1.Code, rec1.Body)
	}
	fenced := logs.Events(t, api.EventFencedOut)
	if len(fenced) != 1 || fenced[0]["resource"] != "rail" || fenced[0]["presentedToken"] != float64(tokenA) {
		t.Errorf("fenced_out events %v; want one at the rail with the stale token %d", fenced, tokenA)
	}
	if n := len(logs.Events(t, "fault_pause_started")); n != 1 {
		t.Errorf("%d pauses; want only delivery 1's", n)
	}
	pool, err := pgxpool.New(ctx, st.paydb)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rep := st.audit(ctx, t, pool)
	if n := len(st.stub.Submissions(ev.PayoutID)); n != 1 || !rep.Balanced || rep.Debits != 1 {
		t.Errorf("rail received the payout %d times; audit balanced=%v debits=%d %v; want once, balanced, one debit", n, rep.Balanced, rep.Debits, rep.Violations)
	}
}

// awaitEvent returns the first log event called name, polling the buffer
// until it appears or ctx ends.
func awaitEvent(ctx context.Context, t *testing.T, logs *logtest.Buffer, name string) map[string]any {
	t.Helper()
	for {
		if evs := logs.Events(t, name); len(evs) > 0 {
			return evs[0]
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			t.Fatalf("no %s event", name)
		}
	}
}
