package e2e_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor/fault"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/logtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
)

// TestStaleFirstOrRevokedHolderDoesNotPayTwice runs, with both fence points
// on, the two orderings the staged experiment could not produce, each on
// one lock backend (both with -matrix.full, make test-full):
//
//   - the stale submission arrives first: A stalls after its last lease
//     confirmation, its lease expires, B claims and confirms, and A's
//     submission reaches rail-proxy before B's;
//   - an operator's revoke, acknowledged right after A's claim, stops A
//     before the rail.
//
// Outcomes are read from the rail's journal, raildb and paydb.
func TestStaleFirstOrRevokedHolderDoesNotPayTwice(t *testing.T) {
	ctx := begin(t, "PostgreSQL and etcd", 5*time.Minute)
	backends := lockStores(ctx, t)
	for _, backend := range backendsOf(0) {
		t.Run(backend+"/stale-submission-arrives-first", func(t *testing.T) {
			var logs logtest.Buffer
			log := slog.New(slog.NewJSONHandler(&logs, nil))
			st := newStack(ctx, t, log, backends[backend], fences{true, true})
			staleSubmissionFirst(ctx, t, st, log)
		})
	}
	for _, backend := range backendsOf(1) {
		t.Run(backend+"/revoke-after-the-claim", func(t *testing.T) {
			log := logger(t)
			st := newStack(ctx, t, log, backends[backend], fences{true, true})
			revokeAfterClaim(ctx, t, st, log)
		})
	}
}

func createPayout(t *testing.T, st *stack, ev payoutevent.Event) {
	t.Helper()
	if code := postJSON(t, st.pay+api.PathAccounts, map[string]any{"accountId": ev.AccountID, "currency": ev.Currency, "openingBalanceMinor": 1_000_000}); code != http.StatusCreated {
		t.Fatalf("create account: %d", code)
	}
	if code := postJSON(t, st.pay+api.PathPayouts, map[string]any{"payoutId": ev.PayoutID, "accountId": ev.AccountID, "amountMinor": ev.AmountMinor, "currency": ev.Currency}); code != http.StatusCreated {
		t.Fatalf("create payout: %d", code)
	}
}

// checkPaidOnce reads the outcome of ev from the rail's journal and the
// audit across the records.
func checkPaidOnce(ctx context.Context, t *testing.T, st *stack, ev payoutevent.Event) {
	t.Helper()
	pool, err := pgxpool.New(ctx, st.paydb)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rep := st.audit(ctx, t, pool)
	if n := len(st.stub.Submissions(ev.PayoutID)); n != 1 || !rep.Balanced || rep.Debits != 1 || len(rep.Unreconciled) != 0 {
		t.Fatalf("rail received %s %d times; audit balanced=%v debits=%d violations=%v unreconciled=%v; want once, balanced, one debit",
			ev.PayoutID, n, rep.Balanced, rep.Debits, rep.Violations, rep.Unreconciled)
	}
}

func staleSubmissionFirst(ctx context.Context, t *testing.T, st *stack, log *slog.Logger) {
	ev := payoutevent.Event{PayoutID: "p-1", AccountID: "acct-7", AmountMinor: 2500, Currency: "EUR"}
	createPayout(t, st, ev)
	part := &partition{lockHost: strings.TrimPrefix(st.lockURL, "http://")}
	stalledA, resumeA := make(chan int64, 1), make(chan struct{})
	a := st.executor(t, log, "A", ttl, executor.WithHTTPClient(part), executor.WithFault(fault.Points{
		executor.BeforeSubmit: func(_ context.Context, _ executor.Delivery, lease *client.Lease) {
			token := lease.Token()
			part.set(true) // A stops renewing: its lease expires on the server
			stalledA <- token
			<-resumeA
		},
	}))
	aDone := make(chan error, 1)
	go func() { _, err := a.Execute(ctx, ev); aDone <- err }()
	tokenA := <-stalledA
	awaitLeaseGone(ctx, t, st, ev, tokenA)

	stalledB, resumeB := make(chan int64, 1), make(chan struct{})
	b := st.executor(t, log, "B", ttl, executor.WithFault(fault.Points{
		executor.BeforeSubmit: func(_ context.Context, _ executor.Delivery, lease *client.Lease) {
			token := lease.Token()
			stalledB <- token
			<-resumeB
		},
	}))
	type result struct {
		out executor.Outcome
		err error
	}
	bDone := make(chan result, 1)
	go func() { out, err := b.Execute(ctx, ev); bDone <- result{out, err} }()
	tokenB := <-stalledB
	if tokenB <= tokenA {
		t.Fatalf("token B %d is not greater than token A %d", tokenB, tokenA)
	}
	// B has claimed and confirmed; A's submission goes first and is let
	// through (nothing above token A has reached rail-proxy yet).
	close(resumeA)
	errA := <-aDone
	t.Logf("A (token %d) ended with %v", tokenA, errA)
	if n := len(st.stub.Submissions(ev.PayoutID)); n != 1 {
		t.Fatalf("after A: rail received %d submissions, want 1 (A's)", n)
	}
	close(resumeB)
	rb := <-bDone
	if rb.err != nil || rb.out != executor.OutcomePosted {
		t.Fatalf("B: %q, %v; want posted (A's submission's outcome, reported by B)", rb.out, rb.err)
	}
	checkPaidOnce(ctx, t, st, ev)
}

// awaitLeaseGone waits until the server no longer reports the lease of
// token on ev's key.
func awaitLeaseGone(ctx context.Context, t *testing.T, st *stack, ev payoutevent.Event, token int64) {
	t.Helper()
	for {
		s, err := st.store.Inspect(ctx, ev.LockKey())
		if err != nil {
			t.Fatal(err)
		}
		if s.Lease == nil || s.Lease.Token != token {
			return
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("the lease never expired")
		}
	}
}

func revokeAfterClaim(ctx context.Context, t *testing.T, st *stack, log *slog.Logger) {
	ev := payoutevent.Event{PayoutID: "p-1", AccountID: "acct-7", AmountMinor: 2500, Currency: "EUR"}
	createPayout(t, st, ev)
	operator, err := client.New(st.lockURL)
	if err != nil {
		t.Fatal(err)
	}
	// A long TTL: only the revoke can end A's lease during the test.
	a := st.executor(t, log, "A", time.Minute, executor.WithFault(fault.Points{
		executor.AfterClaim: func(ctx context.Context, _ executor.Delivery, lease *client.Lease) {
			if _, err := operator.Revoke(ctx, ev.LockKey(), lease.Token(), "game day"); err != nil {
				t.Errorf("revoke: %v", err)
			}
		},
	}))
	if out, err := a.Execute(ctx, ev); !errors.Is(err, executor.ErrNoLongerHolder) {
		t.Fatalf("A after the revoke: %q, %v; want ErrNoLongerHolder", out, err)
	}
	if n := len(st.stub.Submissions(ev.PayoutID)); n != 0 {
		t.Fatalf("the rail received %d submissions from the revoked holder, want 0", n)
	}
	// The next delivery finishes the payout.
	b := st.executor(t, log, "B", time.Minute)
	if out, err := b.Execute(ctx, ev); err != nil || out != executor.OutcomePosted {
		t.Fatalf("B: %q, %v; want posted", out, err)
	}
	checkPaidOnce(ctx, t, st, ev)
}
