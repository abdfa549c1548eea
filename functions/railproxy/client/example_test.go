package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgcluster"
)

// The examples run the real rail-proxy (its HTTP handler over a raildb in
// a throwaway PostgreSQL cluster, one database per example) in front of
// the lab's rail stub; a real program is given the URL of a deployed one.
var (
	clusterOnce sync.Once
	cluster     *pgcluster.Cluster
	databases   atomic.Int64
)

func TestMain(m *testing.M) {
	code := m.Run()
	if cluster != nil {
		if err := cluster.Close(); err != nil {
			log.Print(err)
			code = 1
		}
	}
	os.Exit(code)
}

// startRailProxy serves rail-proxy over a fresh database, forwarding to a
// fresh rail stub.
func startRailProxy() (baseURL string, stop func()) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var err error
	clusterOnce.Do(func() { cluster, err = pgcluster.Start(ctx, pgcluster.Config{}) })
	if err != nil || cluster == nil {
		log.Fatalf("start PostgreSQL: %v", err)
	}
	name := "example_" + strconv.FormatInt(databases.Add(1), 10)
	admin, err := pgx.Connect(ctx, cluster.AdminDSN())
	if err != nil {
		log.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		log.Fatal(err)
	}
	u, err := url.Parse(cluster.AdminDSN())
	if err != nil {
		log.Fatal(err)
	}
	u.Path = "/" + name
	quiet := slog.New(slog.DiscardHandler)
	stub, err := railstub.New(railstub.DefaultConfig(), quiet)
	if err != nil {
		log.Fatal(err)
	}
	rail := httptest.NewServer(stub)
	cfg := railproxy.DefaultConfig()
	cfg.DB.DSN, cfg.RailURL = u.String(), rail.URL
	// The test deployment's keys: lock-server's public key, and the key
	// rail-proxy signs its receipts with.
	cfg.ProofKeys, cfg.ReceiptKey = fencingtest.ProofKeys(), fencingtest.ReceiptSigningKey()
	cfg.TermsKeys = fencingtest.TermsKeys()
	proxy, err := railproxy.New(ctx, cfg, quiet)
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(proxy)
	return srv.URL, func() { srv.Close(); _ = proxy.Close(); _ = stub.Close(); rail.Close() }
}

// holderOf stands in for a worker's lease on payout:{account}: in a worker,
// fencewire.Holder{Token: lease.Token(), Proof: lease.Proof(), Owner: owner}.
func holderOf(account string, token int64, owner string) fencewire.Holder {
	return fencingtest.Holder(account, token, owner)
}

// payout stands in for a payout payment-resource created: its terms, with
// payment-resource's signature over them. In a worker, the fields and
// TermsSignature of the payout as payment-resource answered its claim.
func payout(id, account string, amount int64, currency string) api.SubmitRequest {
	req := api.SubmitRequest{PayoutID: id, AccountID: account, AmountMinor: amount, Currency: currency}
	req.TermsSignature = fencingtest.Terms(req.Terms())
	return req
}

// Submit a payout to the rail as the holder of the lease payout:acct-7
// with fencing token 7, then read what rail-proxy recorded.
func Example() {
	base, stop := startRailProxy()
	defer stop()
	ctx := context.Background()
	rail, err := client.New(base)
	if err != nil {
		log.Fatal(err)
	}
	const token = 7 // the lease's fencing token
	ans, err := rail.Submit(ctx, holderOf("acct-7", token, "worker-a"), payout("p-1", "acct-7", 2500, "EUR"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("rail answered:", ans.Status, ans.RailRef, "token", ans.Token)

	hw, _ := rail.HighWater(ctx, "acct-7")
	attempts, _ := rail.Attempts(ctx, "p-1")
	fmt.Println("high-water:", hw)
	for _, a := range attempts {
		fmt.Println("attempt:", a.State, "token", a.Token, "owner", a.OwnerID)
	}
	// Output:
	// rail answered: ACK rail-000001 token 7
	// high-water: 7
	// attempt: acked token 7 owner worker-a
}

// A holder whose lease was taken over is refused by rail-proxy's fence,
// not by the lock: the newer holder has submitted with a greater token.
// The refusal is an *Error that matches ErrFencedOut; the rail was not
// called.
func Example_fencedOut() {
	base, stop := startRailProxy()
	defer stop()
	ctx := context.Background()
	rail, _ := client.New(base)
	// B holds the newer lease (token 9) and submits p-2; A (token 8) was
	// paused and submits p-1 of the same account afterwards.
	if _, err := rail.Submit(ctx, holderOf("acct-7", 9, "worker-b"), payout("p-2", "acct-7", 100, "EUR")); err != nil {
		log.Fatal(err)
	}
	_, err := rail.Submit(ctx, holderOf("acct-7", 8, "worker-a"), payout("p-1", "acct-7", 2500, "EUR"))
	fmt.Println("fenced out:", errors.Is(err, client.ErrFencedOut))
	var refusal *client.Error
	if errors.As(err, &refusal) {
		fmt.Println(refusal.Status, refusal.Code, "retryable:", refusal.Retryable)
	}
	attempts, _ := rail.Attempts(ctx, "p-1")
	fmt.Println("p-1:", attempts[0].State, "token", attempts[0].Token)
	// Output:
	// fenced out: true
	// 409 FENCED_OUT retryable: false
	// p-1: fenced token 8
}

// A payout goes to the rail once. A second submission, even with a newer
// token, is refused with the first attempt, whose outcome the caller
// reports instead of paying again.
func Example_alreadySubmitted() {
	base, stop := startRailProxy()
	defer stop()
	ctx := context.Background()
	rail, _ := client.New(base)
	req := payout("p-1", "acct-7", 2500, "EUR")
	if _, err := rail.Submit(ctx, holderOf("acct-7", 7, "worker-a"), req); err != nil {
		log.Fatal(err)
	}
	_, err := rail.Submit(ctx, holderOf("acct-7", 8, "worker-b"), req)
	var refusal *client.Error
	if errors.Is(err, client.ErrAlreadySubmitted) && errors.As(err, &refusal) {
		first := refusal.Attempt
		fmt.Println("first attempt:", first.State, first.RailRef, "token", first.Token, "owner", first.OwnerID)
	}
	// Output:
	// first attempt: acked rail-000001 token 7 owner worker-a
}

// A request the client can tell is invalid is refused before it is sent;
// an account no token was accepted for has no high-water mark.
func ExampleClient_HighWater() {
	base, stop := startRailProxy()
	defer stop()
	ctx := context.Background()
	rail, _ := client.New(base)

	_, err := rail.HighWater(ctx, "acct-404")
	fmt.Println("not found:", errors.Is(err, client.ErrNotFound))
	_, err = rail.Submit(ctx, fencewire.Holder{Token: 0, Owner: "worker-a"}, payout("p-1", "acct-7", 2500, "EUR"))
	fmt.Println("token 0:", errors.Is(err, client.ErrInvalidRequest))
	// Output:
	// not found: true
	// token 0: true
}
