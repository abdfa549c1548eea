package e2e_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
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

// partition is a transport that can cut a worker off from lock-server, as
// a stopped process is: its renewals stop reaching the server, so the
// server expires its lease on schedule. Requests to other hosts pass.
type partition struct {
	lockHost string
	mu       sync.Mutex
	cut      bool
}

func (p *partition) set(cut bool) { p.mu.Lock(); p.cut = cut; p.mu.Unlock() }

func (p *partition) Do(r *http.Request) (*http.Response, error) {
	p.mu.Lock()
	cut := p.cut && r.URL.Host == p.lockHost
	p.mu.Unlock()
	if cut {
		return nil, errors.New("partition: lock-server unreachable")
	}
	return http.DefaultClient.Do(r)
}

// TestStaleHolderMatrix is the fencing argument in one process, for each
// setting of the two kill switches, on one backend each (both with
// -matrix.full, make test-full). Worker A takes the
// lease and claims the payout, then stalls after its last lease confirmation,
// cut off from lock-server; the server expires A's lease; worker B takes
// the lease with a larger token and completes the payout; A resumes and
// submits as if it still held the lease. The outcome is read from the
// rail-stub's record and the ledger, never from what the workers say.
func TestStaleHolderMatrix(t *testing.T) {
	ctx := begin(t, "PostgreSQL and etcd", 5*time.Minute)
	backends := lockStores(ctx, t)
	cells := []struct {
		name        string
		f           fences
		wantRail    int
		wantDebits  int
		wantBalance bool
		wantFenced  string // resource of the fenced_out event, "" for none
	}{
		{"both-off", fences{false, false}, 2, 2, false, ""},
		{"both-on", fences{true, true}, 1, 1, true, "rail"},
		{"payment-only", fences{true, false}, 2, 1, false, "payout"},
		{"rail-only", fences{false, true}, 1, 1, true, "rail"},
	}
	for i, c := range cells {
		for _, backend := range backendsOf(i) {
			t.Run(backend+"/"+c.name, func(t *testing.T) {
				var logs logtest.Buffer
				// lease_acquired, which grantedToken reads, is DEBUG.
				log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
				st := newStack(ctx, t, log, backends[backend], c.f)
				got := staleHolderRun(ctx, t, st, log, &logs)
				if got.rail != c.wantRail || got.debits != c.wantDebits || got.balanced != c.wantBalance {
					t.Errorf("rail submissions %d, debits %d, ledger balanced %v; want %d, %d, %v",
						got.rail, got.debits, got.balanced, c.wantRail, c.wantDebits, c.wantBalance)
				}
				if got.tokenB <= got.tokenA {
					t.Errorf("token B %d is not greater than token A %d", got.tokenB, got.tokenA)
				}
				fenced := logs.Events(t, api.EventFencedOut)
				if c.wantFenced == "" {
					if len(fenced) != 0 {
						t.Errorf("fenced_out logged with both fences off: %v", fenced)
					}
					return
				}
				if len(fenced) == 0 {
					t.Fatalf("no fenced_out event; want one from %s", c.wantFenced)
				}
				ev := fenced[0]
				if ev["resource"] != c.wantFenced || ev["presentedToken"] != float64(got.tokenA) || ev["highestToken"] != float64(got.tokenB) || ev["ownerId"] != "A" {
					t.Errorf("fenced_out %v; want resource %s, presentedToken %d (A), highestToken %d (B), ownerId A", ev, c.wantFenced, got.tokenA, got.tokenB)
				}
			})
		}
	}
}

// ttl is the lease TTL of both workers: short, so that A's lease expires
// quickly once A stops renewing (etcd rounds it up to its 1 s floor).
const ttl = time.Second

type staleOutcome struct {
	tokenA, tokenB int64
	rail, debits   int
	balanced       bool
}

func staleHolderRun(ctx context.Context, t *testing.T, st *stack, log *slog.Logger, logs *logtest.Buffer) staleOutcome {
	t.Helper()
	ev := payoutevent.Event{PayoutID: "p-1", AccountID: "acct-7", AmountMinor: 2500, Currency: "EUR"}
	if code := postJSON(t, st.pay+api.PathAccounts, map[string]any{"accountId": "acct-7", "currency": "EUR", "openingBalanceMinor": 1_000_000}); code != http.StatusCreated {
		t.Fatalf("create account: %d", code)
	}
	if code := postJSON(t, st.pay+api.PathPayouts, map[string]any{"payoutId": ev.PayoutID, "accountId": ev.AccountID, "amountMinor": ev.AmountMinor, "currency": ev.Currency}); code != http.StatusCreated {
		t.Fatalf("create payout: %d", code)
	}
	lockHost := strings.TrimPrefix(st.lockURL, "http://")
	part := &partition{lockHost: lockHost}
	stalled, resume := make(chan int64, 1), make(chan struct{})
	a := st.executor(t, log, "A", ttl, executor.WithHTTPClient(part), executor.WithFault(fault.Points{
		executor.BeforeSubmit: func(_ context.Context, _ executor.Delivery, lease *client.Lease) {
			token := lease.Token()
			part.set(true) // A stops: no more renewals reach the server
			stalled <- token
			<-resume
			part.set(false)
		},
	}))
	aDone := make(chan error, 1)
	go func() { _, err := a.Execute(ctx, ev); aDone <- err }()
	var out staleOutcome
	select {
	case out.tokenA = <-stalled:
	case err := <-aDone:
		t.Fatalf("A finished before stalling: %v", err)
	}
	// The server expires A's lease on its own clock.
	for {
		s, err := st.store.Inspect(ctx, ev.LockKey())
		if err != nil {
			t.Fatal(err)
		}
		if s.Lease == nil || s.Lease.Token != out.tokenA {
			break
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("A's lease never expired")
		}
	}
	b := st.executor(t, log, "B", ttl)
	if res, err := b.Execute(ctx, ev); err != nil || res != executor.OutcomePosted {
		t.Fatalf("B: %q, %v; want posted", res, err)
	}
	out.tokenB = grantedToken(t, logs, "B")
	close(resume)
	errA := <-aDone
	t.Logf("A (token %d) ended with %v; B had token %d", out.tokenA, errA, out.tokenB)

	// Measure from the rail and the ledger.
	out.rail = len(st.stub.Submissions(ev.PayoutID))
	pool, err := pgxpool.New(ctx, st.paydb)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger_txn WHERE kind = 'payout_debit' AND payout_id = $1`, ev.PayoutID).Scan(&out.debits); err != nil {
		t.Fatal(err)
	}
	// Balanced means paydb's own rules hold AND the rail's journal agrees:
	// one submission, and every acknowledgement has its debit.
	rep := st.audit(ctx, t, pool)
	out.balanced = rep.Balanced
	if !out.balanced {
		t.Logf("audit across the rail, raildb and paydb: %v", rep.Violations)
	}
	return out
}

// grantedToken is the token of the lease owner was granted, read from its
// lease_acquired log event.
func grantedToken(t *testing.T, logs *logtest.Buffer, owner string) int64 {
	t.Helper()
	for _, ev := range logs.Events(t, "lease_acquired") {
		if ev["ownerId"] == owner {
			return int64(ev["token"].(float64))
		}
	}
	t.Fatalf("no lease_acquired event for %s", owner)
	return 0
}
