package soak

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync/atomic"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
	"github.com/distributed-lock-lab/distributed-lock-lab/harness/drive"
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
	cfg  Config
	plan plan
	d    *drive.Driver
	dups atomic.Int64
}

func (l *loader) duplicates() int { return int(l.dups.Load()) }

func (l *loader) createAccounts(ctx context.Context) error {
	for _, a := range l.plan.accounts {
		if err := l.d.CreateAccount(ctx, a, Currency, OpeningBalanceMinor); err != nil {
			return err
		}
	}
	return nil
}

// createPayouts creates every payout of the plan (CreateWorkers at a
// time, paced by Rate) and publishes the duplicates.
func (l *loader) createPayouts(ctx context.Context) error {
	evs := make([]payoutevent.Event, len(l.plan.payouts))
	for i, p := range l.plan.payouts {
		evs[i] = p.event()
	}
	return l.d.Load(ctx, evs, drive.Load{Workers: l.cfg.CreateWorkers, Rate: l.cfg.Rate, Then: func(ctx context.Context, ev payoutevent.Event) error {
		if p, ok := l.byID(ev.PayoutID); !ok || !p.duplicate {
			return nil
		}
		if err := l.d.Publish(ctx, ev); err != nil {
			return err
		}
		l.dups.Add(1)
		return nil
	}})
}

// event is p's payout event.
func (p plannedPayout) event() payoutevent.Event {
	return payoutevent.Event{PayoutID: p.id, AccountID: p.account, AmountMinor: p.amount, Currency: Currency}
}

// byID returns the planned payout with id.
func (l *loader) byID(id string) (plannedPayout, bool) {
	n, err := strconv.Atoi(id[len("soak-"):])
	if err != nil || n < 1 || n > len(l.plan.payouts) {
		return plannedPayout{}, false
	}
	return l.plan.payouts[n-1], true
}
