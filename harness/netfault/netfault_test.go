package netfault_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	payclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	railclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/reconciler"
	"github.com/distributed-lock-lab/distributed-lock-lab/harness/drive"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/link"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
	lockapi "github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/lockmodel"
)

// The tests share one stack with links (postgres backend, one executor
// "A" fed by the push bridge, a reconciler run on demand); each uses
// accounts of its own and heals what it broke.
const (
	leaseTTL = 2 * time.Second
	opening  = 1_000_000
	amount   = 1_000
	currency = "EUR"
)

var (
	shared    *drive.Driver
	sharedErr error
	once      sync.Once
	stopPush  func()
)

func TestMain(m *testing.M) {
	code := m.Run()
	if stopPush != nil {
		stopPush()
	}
	if shared != nil {
		shared.Close()
	}
	os.Exit(code)
}

// driver returns the shared stack, started on first use; it skips when
// PostgreSQL is missing here, except under CI.
func driver(t *testing.T) *drive.Driver {
	t.Helper()
	if testing.Short() {
		t.Skip("starts the whole stack; skipped under -short")
	}
	once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		var bin string
		if bin, sharedErr = stack.CachedBinaries(ctx); sharedErr != nil {
			return
		}
		shared, sharedErr = drive.Start(context.WithoutCancel(ctx), stack.Config{BinDir: bin,
			Backend: stack.BackendPostgres, PaymentFencing: true, RailFencing: true, Links: true,
			Executors: []stack.ExecutorSpec{{Name: "A"}}, LeaseTTL: leaseTTL, ReconcileEvery: time.Hour,
			PushTimeout: 10 * time.Second,
		})
		if sharedErr == nil {
			stopPush, sharedErr = shared.Stack().Push(context.Background(), slog.New(slog.DiscardHandler))
		}
	})
	if errors.Is(sharedErr, stack.ErrPrerequisite) && os.Getenv("CI") != "true" {
		t.Skipf("the local stack cannot start here: %v", sharedErr)
	}
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

// inject puts f on the stack's link called name until the test ends.
func inject(t *testing.T, st *stack.Stack, name string, f link.Fault) *link.Link {
	t.Helper()
	l, err := st.Link(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Inject(f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Heal() })
	return l
}

// await polls cond every 20 ms until it holds, fails or 30 s pass.
func await(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: not within 30 s", what)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition held elsewhere
	}
}

// state returns the payout's state.
func state(ctx context.Context, d *drive.Driver, id string) (api.State, error) {
	p, err := d.Pay.Payout(ctx, id)
	return p.State, err
}

// payout creates an account of its own and one payout on it.
func payout(t *testing.T, d *drive.Driver, name string) payoutevent.Event {
	t.Helper()
	ctx := t.Context()
	ev := payoutevent.Event{PayoutID: "nf-" + name, AccountID: "nf-acct-" + name, AmountMinor: amount, Currency: currency}
	if err := d.CreateAccount(ctx, ev.AccountID, currency, opening); err != nil {
		t.Fatal(err)
	}
	return ev
}

// judge asserts the run from the records: the rail paid each payout of
// ids at most once (from its journal), wantPaid of them at all, and the
// audit finds the books balanced with no violation.
func judge(t *testing.T, d *drive.Driver, wantPaid int, ids ...string) {
	t.Helper()
	a, err := d.Audit(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	paid := map[string]int{}
	for _, s := range a.Journal {
		if s.Answer.Status == "ACK" {
			paid[s.Request.PayoutID]++
		}
	}
	got := 0
	for _, id := range ids {
		if paid[id] > 1 {
			t.Errorf("the rail's journal: payout %s paid %d times, want at most once", id, paid[id])
		}
		got += paid[id]
	}
	if got != wantPaid {
		t.Errorf("the rail's journal: %d of %v paid, want %d", got, ids, wantPaid)
	}
	r := a.Report
	if !r.Balanced || len(r.Violations) > 0 || len(r.RailPaidNoDebit) > 0 || len(r.DebitNoRailPayment) > 0 {
		t.Errorf("audit: balanced %v, violations %v, rail paid without debit %v, debit without payment %v; want balanced and none",
			r.Balanced, r.Violations, r.RailPaidNoDebit, r.DebitNoRailPayment)
	}
	for _, id := range ids {
		for _, u := range r.Unreconciled {
			if u == id {
				t.Errorf("audit: payout %s unreconciled", id)
			}
		}
	}
}

// The rail pays, and its ACK is lost on the way back to rail-proxy: the
// payout is ambiguous until the reconciler asks the rail, which says
// paid; it is posted with one debit, and the rail paid once.
func TestRailAckLostAfterTheRailPaid(t *testing.T) {
	d := driver(t)
	ctx, st := t.Context(), d.Stack()
	ev := payout(t, d, "ack-lost")
	l := inject(t, st, stack.LinkRail, link.Fault{Kind: link.ResetAfter, Bytes: 0})
	if _, err := d.CreatePayout(ctx, ev); err != nil {
		t.Fatal(err)
	}
	await(t, "the payout ambiguous", func() (bool, error) {
		s, err := state(ctx, d, ev.PayoutID)
		return s == api.StateAmbiguous, err
	})
	if err := l.Heal(); err != nil {
		t.Fatal(err)
	}
	judgePaidOnce := func() {
		a, err := d.Audit(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, s := range a.Journal {
			if s.Request.PayoutID == ev.PayoutID {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("the rail's journal holds %d submissions of %s while it is ambiguous, want 1 (the rail acted, the answer was lost)", n, ev.PayoutID)
		}
	}
	judgePaidOnce()
	await(t, "the reconciler to post the payout", func() (bool, error) {
		if err := runReconciler(ctx, st); err != nil {
			return false, err
		}
		s, err := state(ctx, d, ev.PayoutID)
		return s == api.StatePosted, err
	})
	judge(t, d, 1, ev.PayoutID)
}

// runReconciler runs one reconciler pass.
func runReconciler(ctx context.Context, st *stack.Stack) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, st.ReconcilerURL()+reconciler.PathRuns, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("reconciler pass: %s", resp.Status)
	}
	return nil
}

// outcome is the history's spelling of a lock call's result.
func outcome(err error) lockmodel.Outcome {
	switch {
	case err == nil:
		return lockmodel.OK
	case errors.Is(err, client.ErrLockHeld):
		return lockmodel.Held
	case errors.Is(err, client.ErrStaleToken):
		return lockmodel.Stale
	case errors.Is(err, client.ErrNotHeld):
		return lockmodel.NotHeld
	}
	return lockmodel.Unknown
}

// ownLink opens a link of the test's own to lock-server, for a client
// the test plays.
func ownLink(t *testing.T, st *stack.Stack, name string) (*link.Link, string) {
	t.Helper()
	host := strings.TrimPrefix(st.LockServerURL(), "http://")
	l, err := link.Open(slog.New(slog.DiscardHandler), name, host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l, "http://" + l.Addr()
}

// lock-server commits a grant and its answer is lost on the way to the
// holder: nobody knows it holds the lease, which ends at its TTL; no
// second holder is granted before, by the lock history (porcupine, the
// lost grant's outcome unknown) and by the payout: executor A's grant is
// lost the same way, and the payout is still paid once.
func TestGrantCommittedAndItsAnswerLost(t *testing.T) {
	d := driver(t)
	ctx, st := t.Context(), d.Stack()
	h := lockmodel.NewHistory()

	// The lock history: A's answer is lost, B watches and then waits.
	la, aURL := ownLink(t, st, "holder-A->lock-server")
	a, err := client.New(aURL, client.WithOwner("nf-A"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := client.New(st.LockServerURL(), client.WithOwner("nf-B"))
	if err != nil {
		t.Fatal(err)
	}
	key := "payout:nf-acct-grant-history"
	if err := la.Inject(link.Fault{Kind: link.ResetAfter, Bytes: 0}); err != nil {
		t.Fatal(err)
	}
	done := h.Call(0, lockmodel.Input{Op: lockmodel.Acquire, Key: key, Owner: "nf-A", TTL: leaseTTL})
	_, err = a.TryAcquire(ctx, key, client.WithTTL(leaseTTL))
	if err == nil {
		t.Fatal("acquire through a link that loses every answer: granted, want an error")
	}
	done(lockmodel.Output{Outcome: outcome(err)})
	done = h.Call(1, lockmodel.Input{Op: lockmodel.Inspect, Key: key})
	seen, err := b.Inspect(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if !seen.Held || seen.Lease.Owner != "nf-A" {
		t.Fatalf("inspect after A's lost answer: held %v by %q, want held by nf-A (the grant committed)", seen.Held, seen.Lease.Owner)
	}
	done(lockmodel.Output{Outcome: lockmodel.OK, Owner: seen.Lease.Owner, Token: seen.Lease.Token})
	done = h.Call(1, lockmodel.Input{Op: lockmodel.Acquire, Key: key, Owner: "nf-B", TTL: leaseTTL})
	lb, err := b.Acquire(ctx, key, client.WithTTL(leaseTTL))
	if err != nil {
		t.Fatal(err)
	}
	done(lockmodel.Output{Outcome: lockmodel.OK, Token: lb.Token()})
	if lb.Token() <= seen.Lease.Token {
		t.Errorf("B's token %d after A's lost grant %d: want larger", lb.Token(), seen.Lease.Token)
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lockmodel.Check(t.Name(), h.Operations(), 10*time.Second); err != nil {
		t.Fatal(err)
	}

	// The same loss on executor A's link, with a payout behind it.
	ev := payout(t, d, "grant-lost")
	l := inject(t, st, stack.ExecutorLink("A", stack.ToLockServer), link.Fault{Kind: link.ResetAfter, Bytes: 0})
	if _, err := d.CreatePayout(ctx, ev); err != nil {
		t.Fatal(err)
	}
	await(t, "executor A's lost grant", func() (bool, error) {
		s, err := b.Inspect(ctx, ev.LockKey())
		return s.Held && s.Lease.Owner == "A", err
	})
	if err := l.Heal(); err != nil {
		t.Fatal(err)
	}
	await(t, "the payout posted", func() (bool, error) {
		s, err := state(ctx, d, ev.PayoutID)
		return s == api.StatePosted, err
	})
	judge(t, d, 1, ev.PayoutID)
}

// A holder cut off from lock-server (its renewals go unanswered) past its
// TTL still reaches the fence points: executor A takes the lease over and
// pays; the stale holder's submission is refused by rail-proxy and its
// write by payment-resource, and the rail paid once.
func TestPartitionedHolderIsFencedAtBothFencePoints(t *testing.T) {
	d := driver(t)
	ctx, st := t.Context(), d.Stack()
	h := lockmodel.NewHistory()
	ev := payout(t, d, "partitioned")
	lh, hURL := ownLink(t, st, "holder-H->lock-server")
	hc, err := client.New(hURL, client.WithOwner("nf-H"))
	if err != nil {
		t.Fatal(err)
	}
	observer, err := client.New(st.LockServerURL(), client.WithOwner("nf-observer"))
	if err != nil {
		t.Fatal(err)
	}
	rc, err := railclient.New(st.RailProxyURL())
	if err != nil {
		t.Fatal(err)
	}

	// H holds the account's lock before the payout exists, so it claims
	// first; executor A, handed the payout, waits for the lock.
	done := h.Call(0, lockmodel.Input{Op: lockmodel.Acquire, Key: ev.LockKey(), Owner: "nf-H", TTL: leaseTTL})
	lease, err := hc.TryAcquire(ctx, ev.LockKey(), client.WithTTL(leaseTTL))
	if err != nil {
		t.Fatal(err)
	}
	done(lockmodel.Output{Outcome: lockmodel.OK, Token: lease.Token()})
	holder := fencewire.Holder{Token: lease.Token(), Proof: lease.Proof(), Owner: "nf-H"}
	if _, err := d.CreatePayout(ctx, ev); err != nil {
		t.Fatal(err)
	}
	claimed, err := d.Pay.Claim(ctx, ev.PayoutID, holder, api.ClaimRequest{})
	if err != nil {
		t.Fatalf("H's claim under its live lease: %v", err)
	}

	// The partition: H's renewal goes unanswered, its lease ends.
	if err := lh.Inject(link.Fault{Kind: link.Timeout}); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	done = h.Call(0, lockmodel.Input{Op: lockmodel.Renew, Key: ev.LockKey(), Owner: "nf-H", Token: lease.Token(), TTL: leaseTTL})
	err = lease.Renew(rctx)
	cancel()
	if err == nil {
		t.Fatal("renew through a timeout link: ok, want an error")
	}
	done(lockmodel.Output{Outcome: lockmodel.Unknown})
	await(t, "executor A to post the payout under a newer lease", func() (bool, error) {
		s, err := state(ctx, d, ev.PayoutID)
		return s == api.StatePosted, err
	})
	done = h.Call(1, lockmodel.Input{Op: lockmodel.Inspect, Key: ev.LockKey()})
	seen, err := observer.Inspect(ctx, ev.LockKey())
	if err != nil {
		t.Fatal(err)
	}
	out := lockmodel.Output{Outcome: lockmodel.OK}
	if seen.Held {
		// Executor A's grant: its acquire is not in the history.
		out.Owner, out.Token, out.Outside = seen.Lease.Owner, seen.Lease.Token, seen.Lease.Owner != "nf-H"
	}
	done(out)

	// H, still believing, goes on to both fence points.
	_, err = rc.Submit(ctx, holder, railapi.SubmitRequest{PayoutID: ev.PayoutID, AccountID: ev.AccountID, AmountMinor: ev.AmountMinor,
		Currency: ev.Currency, TermsSignature: claimed.TermsSignature})
	if !errors.Is(err, railclient.ErrFencedOut) {
		t.Errorf("stale holder's submission at rail-proxy: got %v, want FENCED_OUT", err)
	}
	_, err = d.Pay.PostResult(ctx, ev.PayoutID, holder, api.ResultRequest{Outcome: api.OutcomeAmbiguous})
	if !errors.Is(err, payclient.ErrFencedOut) {
		t.Errorf("stale holder's result at payment-resource: got %v, want FENCED_OUT", err)
	}
	if err := lockmodel.Check(t.Name(), h.Operations(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	judge(t, d, 1, ev.PayoutID)
}

// lockdb partitioned from lock-server (its connections pass nothing):
// an acquire is answered 503 BACKEND_UNAVAILABLE with Retry-After within
// lock-server's own request timeout, not left to the caller's; once the
// link heals, grants resume, and the history (the 503 an unknown outcome)
// is linearizable.
func TestLockDBPartitionedAnswers503WithRetryAfter(t *testing.T) {
	d := driver(t)
	ctx, st := t.Context(), d.Stack()
	h := lockmodel.NewHistory()
	key := "payout:nf-acct-lockdb-partitioned"
	l := inject(t, st, stack.LinkLockDB, link.Fault{Kind: link.Timeout})
	body, err := json.Marshal(lockapi.AcquireRequest{Owner: "nf-P", TTLMs: leaseTTL.Milliseconds()})
	if err != nil {
		t.Fatal(err)
	}
	done := h.Call(0, lockmodel.Input{Op: lockmodel.Acquire, Key: key, Owner: "nf-P", TTL: leaseTTL})
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, st.LockServerURL()+lockapi.PathLockPrefix+key+lockapi.SuffixAcquire, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("acquire with lockdb partitioned: %v, want lock-server's own answer", err)
	}
	var e lockapi.ErrorEnvelope
	_ = json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	done(lockmodel.Output{Outcome: lockmodel.Unknown})
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || e.Error.Code != lockapi.CodeBackendUnavailable {
		t.Fatalf("acquire with lockdb partitioned: %d %s, Retry-After %q; want 503 %s with Retry-After",
			resp.StatusCode, e.Error.Code, resp.Header.Get("Retry-After"), lockapi.CodeBackendUnavailable)
	}
	if err := l.Heal(); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(st.LockServerURL(), client.WithOwner("nf-Q"))
	if err != nil {
		t.Fatal(err)
	}
	done = h.Call(1, lockmodel.Input{Op: lockmodel.Acquire, Key: key, Owner: "nf-Q", TTL: leaseTTL})
	lease, err := c.Acquire(ctx, key, client.WithTTL(leaseTTL))
	if err != nil {
		t.Fatalf("acquire once lockdb is reachable again: %v", err)
	}
	done(lockmodel.Output{Outcome: lockmodel.OK, Token: lease.Token()})
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lockmodel.Check(t.Name(), h.Operations(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
}
