package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	payclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutbus"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

// plannedPayout is one payout of the plan.
type plannedPayout struct {
	id, account string
	amount      int64 // minor units
	duplicate   bool  // its event is published a second time
}

// plan is every payout of a run, drawn from the seed before the run.
type plan struct {
	accounts []string
	payouts  []plannedPayout
}

func newPlan(cfg Config) plan {
	rng := rand.New(rand.NewPCG(cfg.Seed, 1))
	var p plan
	for i := range cfg.Accounts {
		p.accounts = append(p.accounts, "soak-acct-"+strconv.Itoa(i+1))
	}
	for i := range cfg.Payouts {
		amount := 100 + rng.Int64N(500_000)
		if rng.Float64() < cfg.DeclineRatio {
			amount = railstub.DefaultDeclineOverMinor + 1 + rng.Int64N(railstub.DefaultDeclineOverMinor)
		}
		p.payouts = append(p.payouts, plannedPayout{
			id: payoutID(i), account: p.accounts[rng.IntN(len(p.accounts))], amount: amount,
			duplicate: rng.Float64() < cfg.DuplicateRatio,
		})
	}
	return p
}

// loader creates the accounts and payouts at payment-resource and
// publishes the duplicate events.
type loader struct {
	cfg   Config
	plan  plan
	log   *slog.Logger
	pay   *payclient.Client
	paydb *pgxpool.Pool
	conn  *grpc.ClientConn
	ps    *pubsub.Client
	pub   *payoutbus.Publisher
	dups  atomic.Int64
}

func newLoader(ctx context.Context, cfg Config, st *stack.Stack, p plan, log *slog.Logger) (*loader, error) {
	pay, err := payclient.New(st.PaymentResourceURL())
	if err != nil {
		return nil, err
	}
	paydb, err := pgxpool.New(ctx, st.PayDBURL())
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(st.PubSubAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		paydb.Close()
		return nil, err
	}
	ps, err := pubsub.NewClient(ctx, stack.PubSubProject, option.WithGRPCConn(conn))
	if err != nil {
		paydb.Close()
		conn.Close()
		return nil, err
	}
	return &loader{cfg: cfg, plan: p, log: log, pay: pay, paydb: paydb, conn: conn, ps: ps,
		pub: payoutbus.NewPublisher(ps, stack.PubSubTopic)}, nil
}

func (l *loader) close() {
	l.pub.Stop()
	l.ps.Close()
	l.conn.Close()
	l.paydb.Close()
}

func (l *loader) duplicates() int { return int(l.dups.Load()) }

// retry calls f until it succeeds, fails with an error that is not
// payment-resource being unavailable (it may be down: killed), or ctx
// ends. The pause between attempts grows from 20 ms to 500 ms.
func retry(ctx context.Context, f func(context.Context) error) error {
	wait := 20 * time.Millisecond
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := f(cctx)
		cancel()
		if err == nil || !errors.Is(err, payclient.ErrUnavailable) {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-t.C:
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

func (l *loader) createAccounts(ctx context.Context) error {
	opening := int64(OpeningBalanceMinor)
	for _, a := range l.plan.accounts {
		err := retry(ctx, func(ctx context.Context) error {
			_, err := l.pay.CreateAccount(ctx, api.AccountRequest{AccountID: a, Currency: Currency, OpeningBalanceMinor: &opening})
			return err
		})
		if err != nil {
			return fmt.Errorf("create account %s: %w", a, err)
		}
	}
	return nil
}

// createPayouts creates every payout of the plan (CreateWorkers at a
// time, paced by Rate) and publishes the duplicates.
func (l *loader) createPayouts(ctx context.Context) error {
	jobs := make(chan plannedPayout)
	errs := make([]error, l.cfg.CreateWorkers)
	var wg sync.WaitGroup
	for w := range l.cfg.CreateWorkers {
		// Ends when jobs is closed or at its first error.
		wg.Go(func() {
			for p := range jobs {
				if errs[w] = l.create(ctx, p); errs[w] != nil {
					for range jobs { // drain, so the feeder is not blocked
					}
					return
				}
			}
		})
	}
	var tick <-chan time.Time
	if l.cfg.Rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / l.cfg.Rate))
		defer t.Stop()
		tick = t.C
	}
	var err error
feed:
	for i, p := range l.plan.payouts {
		if tick != nil && i > 0 {
			select {
			case <-tick:
			case <-ctx.Done():
				err = ctx.Err()
				break feed
			}
		}
		select {
		case jobs <- p:
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	return errors.Join(append(errs, err)...)
}

func (l *loader) create(ctx context.Context, p plannedPayout) error {
	err := retry(ctx, func(ctx context.Context) error {
		_, err := l.pay.CreatePayout(ctx, api.PayoutRequest{PayoutID: p.id, AccountID: p.account, AmountMinor: p.amount, Currency: Currency})
		return err
	})
	if err != nil {
		return fmt.Errorf("create payout %s: %w", p.id, err)
	}
	if p.duplicate {
		if err := l.publish(ctx, p); err != nil {
			return err
		}
		l.dups.Add(1)
	}
	return nil
}

// publish publishes p's event as payment-resource's outbox does (same
// body, ordering key and attributes): a second delivery of the same
// payout to some executor.
func (l *loader) publish(ctx context.Context, p plannedPayout) error {
	data, err := json.Marshal(payoutevent.Event{PayoutID: p.id, AccountID: p.account, AmountMinor: p.amount, Currency: Currency})
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := l.pub.Publish(pctx, p.account, data, map[string]string{payoutevent.AttrPayoutID: p.id, payoutevent.AttrAccountID: p.account}); err != nil {
		return fmt.Errorf("publish payout %s again: %w", p.id, err)
	}
	return nil
}

// byID returns the planned payout with id.
func (l *loader) byID(id string) (plannedPayout, bool) {
	n, err := strconv.Atoi(id[len("soak-"):])
	if err != nil || n < 1 || n > len(l.plan.payouts) {
		return plannedPayout{}, false
	}
	return l.plan.payouts[n-1], true
}
