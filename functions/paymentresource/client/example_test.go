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
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgcluster"
)

// The examples run the real payment-resource (its HTTP handler over a
// paydb in a throwaway PostgreSQL cluster, one database per example); a
// real program is given the URL of a deployed one.
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

// discard is a Publisher that drops the payout events: the examples run no
// executor.
type discard struct{}

func (discard) Publish(context.Context, string, []byte, map[string]string) error { return nil }

// startPaymentResource serves payment-resource over a fresh database.
func startPaymentResource() (baseURL string, stop func()) {
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
	cfg := paymentresource.DefaultConfig()
	cfg.DatabaseURL = u.String()
	// The public keys of the test deployment's lock-server and rail-proxy.
	cfg.ProofKeys, cfg.ReceiptKeys = fencingtest.ProofKeys(), fencingtest.ReceiptKeys()
	cfg.TermsKey = fencingtest.TermsSigningKey()
	svc, err := paymentresource.New(ctx, cfg, discard{}, slog.New(slog.DiscardHandler))
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(svc.Handler())
	return srv.URL, func() { srv.Close(); svc.Close() }
}

func opening(minor int64) *int64 { return &minor }

// holderOf stands in for a worker's lease on payout:{account}: in a worker,
// fencewire.Holder{Token: lease.Token(), Proof: lease.Proof(), Owner: owner}.
func holderOf(account string, token int64, owner string) fencewire.Holder {
	return fencingtest.Holder(account, token, owner)
}

// receiptOf stands in for rail-proxy's answer: in a worker, the Receipt of
// railproxy/api SubmitAnswer, passed on unchanged.
func receiptOf(payout, account string, amount int64, currency string, outcome api.Outcome, railRef string, token int64) string {
	return fencingtest.Receipt(fencewire.RailReceipt{PayoutID: payout, AccountID: account, AmountMinor: amount, Currency: currency,
		Outcome: string(outcome), RailRef: railRef, RailToken: token})
}

// Create an account and a payout, then do what the executor does under
// the lease payout:acct-7 with fencing token 7: claim the payout, and post
// the rail's answer.
func Example() {
	base, stop := startPaymentResource()
	defer stop()
	ctx := context.Background()
	pay, err := client.New(base)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pay.CreateAccount(ctx, api.AccountRequest{AccountID: "acct-7", Currency: "EUR", OpeningBalanceMinor: opening(100_000)}); err != nil {
		log.Fatal(err)
	}
	p, err := pay.CreatePayout(ctx, api.PayoutRequest{PayoutID: "p-1", AccountID: "acct-7", AmountMinor: 2500, Currency: "EUR"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("created:", p.State)

	holder := holderOf("acct-7", 7, "worker-a") // the lease's token 7, its proof, the owner
	if p, err = pay.Claim(ctx, "p-1", holder, api.ClaimRequest{AccountID: "acct-7", AmountMinor: 2500, Currency: "EUR"}); err != nil {
		log.Fatal(err)
	}
	fmt.Println("claimed:", p.State, "fence", p.Fence)
	p, err = pay.PostResult(ctx, "p-1", holder, api.ResultRequest{Outcome: api.OutcomeAck, RailRef: "rail-1",
		Receipt: receiptOf("p-1", "acct-7", 2500, "EUR", api.OutcomeAck, "rail-1", 7)})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("result:", p.State, "debits", p.Debits)

	a, _ := pay.Account(ctx, "acct-7")
	rep, _ := pay.Audit(ctx)
	fmt.Println("balance:", a.BalanceMinor, "balanced:", rep.Balanced)
	// Output:
	// created: pending
	// claimed: claimed fence 7
	// result: posted debits 1
	// balance: 97500 balanced: true
}

// A holder whose lease was taken over is refused by payment-resource's
// fence, not by the lock: the newer holder has written with a greater
// token. The refusal is an *Error that matches ErrFencedOut.
func Example_fencedOut() {
	base, stop := startPaymentResource()
	defer stop()
	ctx := context.Background()
	pay, _ := client.New(base)
	if _, err := pay.CreateAccount(ctx, api.AccountRequest{AccountID: "acct-7", Currency: "EUR", OpeningBalanceMinor: opening(100_000)}); err != nil {
		log.Fatal(err)
	}
	if _, err := pay.CreatePayout(ctx, api.PayoutRequest{PayoutID: "p-1", AccountID: "acct-7", AmountMinor: 2500, Currency: "EUR"}); err != nil {
		log.Fatal(err)
	}
	// B holds the newer lease (token 9) and claims; A (token 8) was paused.
	if _, err := pay.Claim(ctx, "p-1", holderOf("acct-7", 9, "worker-b"), api.ClaimRequest{}); err != nil {
		log.Fatal(err)
	}
	_, err := pay.PostResult(ctx, "p-1", holderOf("acct-7", 8, "worker-a"), api.ResultRequest{Outcome: api.OutcomeAck, RailRef: "rail-a",
		Receipt: receiptOf("p-1", "acct-7", 2500, "EUR", api.OutcomeAck, "rail-a", 8)})
	var refusal *client.Error
	fmt.Println("fenced out:", errors.Is(err, client.ErrFencedOut))
	if errors.As(err, &refusal) {
		fmt.Println(refusal.Status, refusal.Code, "retryable:", refusal.Retryable)
	}
	p, _ := pay.Payout(ctx, "p-1")
	fmt.Println("payout:", p.State, "fence", p.Fence, "debits", p.Debits)
	// Output:
	// fenced out: true
	// 409 FENCED_OUT retryable: false
	// payout: claimed fence 9 debits 0
}

// Each refusal matches the sentinel of its code; a request the client can
// tell is invalid is refused before it is sent.
func ExampleClient_Payout() {
	base, stop := startPaymentResource()
	defer stop()
	ctx := context.Background()
	pay, _ := client.New(base)

	_, err := pay.Payout(ctx, "p-404")
	fmt.Println("not found:", errors.Is(err, client.ErrPayoutNotFound))
	_, err = pay.Claim(ctx, "p-404", fencewire.Holder{Token: 0, Owner: "worker-a"}, api.ClaimRequest{})
	fmt.Println("token 0:", errors.Is(err, client.ErrInvalidRequest))
	// Output:
	// not found: true
	// token 0: true
}
