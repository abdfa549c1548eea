package harness_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	payapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	railclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/harness"
	"github.com/distributed-lock-lab/distributed-lock-lab/harness/drive"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
)

// TestOneTokenTracedThroughTheLiveStack follows one fencing token on a
// live stack (PostgreSQL backend, both fence points on) through the steps
// of docs/token-trace.md, in its order, reading each from the place the
// page names: lock-server's lock_granted (with the path that minted it),
// the lock_lease row, the executor's lease_acquired and payout_claimed,
// payout.fence, rail_high_water and rail_attempt, account.fence and
// payout_posted, lease_released; then the SDK's next grant of the key,
// which overwrites the row, and a stale writer refused by rail-proxy with
// fenced_out. If the page and the code drift apart, a step here fails.
func TestOneTokenTracedThroughTheLiveStack(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, Pub/Sub and every service as processes")
	}
	bin := binDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d, err := drive.Start(ctx, stack.Config{
		Backend: stack.BackendPostgres, PaymentFencing: true, RailFencing: true,
		Executors: []stack.ExecutorSpec{{Name: "A"}}, BinDir: bin, Dir: t.TempDir(),
		LogLevel: "debug", // the page's per-step lines are DEBUG
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	st := d.Stack()
	stopPush, err := st.Push(ctx, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer stopPush()

	ev := payoutevent.Event{PayoutID: "p-trace", AccountID: "acct-trace", AmountMinor: 2500, Currency: "EUR"}
	key := ev.LockKey()
	if err := d.CreateAccount(ctx, ev.AccountID, ev.Currency, 1_000_000); err != nil {
		t.Fatal(err)
	}
	if _, err := d.CreatePayout(ctx, ev); err != nil {
		t.Fatal(err)
	}
	var p payapi.Payout
	for p.State != payapi.StatePosted {
		if ctx.Err() != nil {
			t.Fatalf("payout %s is %q; want posted", ev.PayoutID, p.State)
		}
		time.Sleep(50 * time.Millisecond) // polling a condition
		if p, err = d.Pay.Payout(ctx, ev.PayoutID); err != nil {
			t.Fatal(err)
		}
	}
	lockdb, err := pgx.Connect(ctx, st.LockDBURL())
	if err != nil {
		t.Fatal(err)
	}
	defer lockdb.Close(context.Background())
	// events reads the log events of every process; one picks the one
	// event of service named name that match accepts.
	events := func() []harness.Event {
		evs, err := harness.ReadEvents(st.Processes())
		if err != nil {
			t.Fatal(err)
		}
		return evs
	}
	one := func(evs []harness.Event, service, name string, match func(harness.Event) bool) harness.Event {
		t.Helper()
		var got []harness.Event
		for _, e := range evs {
			if e.Service == service && e.Name == name && match(e) {
				got = append(got, e)
			}
		}
		if len(got) != 1 {
			t.Fatalf("%s %s events: %v; want exactly one", service, name, got)
		}
		return got[0]
	}
	ofPayout := func(e harness.Event) bool { return e.Str("payoutId") == ev.PayoutID }
	evs := events()

	// 1-2. lock-server granted key to A, and says which statement minted it.
	granted := one(evs, "lock-server", lockserver.EventLockGranted, func(e harness.Event) bool { return e.Str("key") == key })
	token := granted.Int("token")
	if by := granted.Str("grantedBy"); granted.Owner() != "A" || token <= 0 ||
		(by != lockserver.GrantedByAcquire && by != lockserver.GrantedByGroup && by != lockserver.GrantedByHandoff) {
		t.Fatalf("lock_granted %v; want owner A, a token, and grantedBy one of acquire, group, handoff", granted.Attrs)
	}
	// 3. lockdb's lock_lease row keeps the token after the release (owner cleared).
	var rowToken int64
	var rowOwner *string
	if err := lockdb.QueryRow(ctx, `SELECT fencing_token, owner_id FROM lock_lease WHERE lock_key = $1`, key).Scan(&rowToken, &rowOwner); err != nil {
		t.Fatal(err)
	}
	if rowToken != token {
		t.Errorf("lock_lease.fencing_token of %s = %d; want the granted token %d", key, rowToken, token)
	}
	// 4. The executor holds the SDK's token.
	if got := one(evs, "executor", executor.EventLeaseAcquired, ofPayout).Int("token"); got != token {
		t.Errorf("executor lease_acquired token %d; want %d", got, token)
	}
	// 5-6. The headers reached fence point one: the claim.
	if got := one(evs, "executor", executor.EventPayoutClaimed, ofPayout).Int("token"); got != token {
		t.Errorf("executor payout_claimed token %d; want %d", got, token)
	}
	if got := one(evs, "payment-resource", payapi.EventPayoutClaimed, ofPayout).Int("token"); got != token {
		t.Errorf("payment-resource payout_claimed token %d; want %d", got, token)
	}
	// 7. Fence point two: the high-water mark and the attempt.
	var hw, attemptToken int64
	var attemptState string
	if err := d.RailDB.QueryRow(ctx, `SELECT high_water FROM rail_high_water WHERE account_id = $1`, ev.AccountID).Scan(&hw); err != nil {
		t.Fatal(err)
	}
	if err := d.RailDB.QueryRow(ctx, `SELECT token, state FROM rail_attempt WHERE payout_id = $1`, ev.PayoutID).Scan(&attemptToken, &attemptState); err != nil {
		t.Fatal(err)
	}
	if hw != token || attemptToken != token || attemptState != string(railapi.StateAcked) {
		t.Errorf("rail_high_water %d, rail_attempt token %d state %s; want %d, %d, acked", hw, attemptToken, attemptState, token, token)
	}
	if got := one(evs, "rail-proxy", railapi.EventSubmissionAcked, func(harness.Event) bool { return true }).Int("token"); got != token {
		t.Errorf("rail-proxy rail_submission_acked token %d; want %d", got, token)
	}
	// 8. Fence point one again: the debit and the post.
	var payoutFence, accountFence int64
	if err := d.PayDB.QueryRow(ctx, `SELECT p.fence, a.fence FROM payout p JOIN account a USING (account_id) WHERE p.payout_id = $1`, ev.PayoutID).Scan(&payoutFence, &accountFence); err != nil {
		t.Fatal(err)
	}
	if payoutFence != token || accountFence != token {
		t.Errorf("payout.fence %d, account.fence %d; want %d for both", payoutFence, accountFence, token)
	}
	if got := one(evs, "payment-resource", payapi.EventPayoutPosted, ofPayout).Int("token"); got != token {
		t.Errorf("payment-resource payout_posted token %d; want %d", got, token)
	}
	// 9. The release: lock-server's lease_released. It is sent after the
	// push's answer, so it may still be on its way.
	released := func(e harness.Event) bool { return e.Str("key") == key && e.Int("token") == token }
	for {
		n := 0
		for _, e := range events() {
			if e.Service == "lock-server" && e.Name == lockserver.EventLeaseReleased && released(e) {
				n++
			}
		}
		if n == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("lease_released of %s token %d: %d events; want one", key, token, n)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition
	}

	// The SDK's end: the next grant of the key carries a larger token and
	// overwrites the lock_lease row.
	locks, err := client.New(st.LockServerURL(), client.WithOwner("reader"))
	if err != nil {
		t.Fatal(err)
	}
	lease, err := locks.Acquire(ctx, key, client.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lease.Release(context.Background()) }()
	if err := lockdb.QueryRow(ctx, `SELECT fencing_token, owner_id FROM lock_lease WHERE lock_key = $1`, key).Scan(&rowToken, &rowOwner); err != nil {
		t.Fatal(err)
	}
	if lease.Token() <= token || rowToken != lease.Token() || rowOwner == nil || *rowOwner != "reader" {
		t.Errorf("the SDK's next grant: token %d, lock_lease row token %d owner %v; want a token above %d in the row, owner reader", lease.Token(), rowToken, rowOwner, token)
	}

	// A stale writer: a token below the high-water is refused by rail-proxy
	// before the rail, and logged as fenced_out.
	stale := token - 1
	rails, err := railclient.New(st.RailProxyURL())
	if err != nil {
		t.Fatal(err)
	}
	_, err = rails.Submit(ctx, fencewire.Holder{Token: stale, Proof: st.SignGrant(key, stale), Owner: "stale"},
		railapi.SubmitRequest{PayoutID: ev.PayoutID, AccountID: ev.AccountID, AmountMinor: ev.AmountMinor, Currency: ev.Currency, TermsSignature: p.TermsSignature})
	if !errors.Is(err, railclient.ErrFencedOut) {
		t.Fatalf("stale submission with token %d: %v; want FENCED_OUT", stale, err)
	}
	f := one(events(), "rail-proxy", fencewire.EventFencedOut, func(e harness.Event) bool { return e.Owner() == "stale" })
	if f.Str("resource") != "rail" || f.Int("presentedToken") != stale || f.Int("highestToken") != token {
		t.Errorf("fenced_out %v; want resource rail, presentedToken %d, highestToken %d", f.Attrs, stale, token)
	}
}
