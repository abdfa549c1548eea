// Package drive drives payouts through a local stack (package local/stack)
// and audits them from the parts' own records. The experiment, the soak
// (and the end-to-end benchmark through it) and the game day use it:
//
//	d, err := drive.Start(ctx, stack.Config{...})
//	defer d.Close()
//	err = d.CreateAccount(ctx, "acct-1", "EUR", 1_000_000)
//	err = d.Load(ctx, events, drive.Load{Workers: 4})
//	a, err := d.Audit(ctx)
package drive

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	payclient "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutaudit"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutbus"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

// Driver is a started stack with the clients a run needs: payment-resource,
// paydb, raildb and Pub/Sub. It is safe for concurrent use.
type Driver struct {
	st *stack.Stack
	// Pay is payment-resource's client.
	Pay *payclient.Client
	// PayDB and RailDB are pools on the stack's paydb and raildb.
	PayDB, RailDB *pgxpool.Pool

	conn      *grpc.ClientConn
	ps        *pubsub.Client
	pub       *payoutbus.Publisher
	closeOnce sync.Once
}

// Start starts a stack with cfg (stack.Start) and opens its clients. Close
// stops both.
func Start(ctx context.Context, cfg stack.Config) (*Driver, error) {
	st, err := stack.Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	d, err := New(ctx, st)
	if err != nil {
		st.Stop()
		return nil, err
	}
	return d, nil
}

// New opens the clients of a running stack. Close closes them and stops
// st.
func New(ctx context.Context, st *stack.Stack) (d *Driver, err error) {
	d = &Driver{st: st}
	defer func() {
		if err != nil {
			d.closeClients()
		}
	}()
	if d.Pay, err = payclient.New(st.PaymentResourceURL()); err != nil {
		return nil, err
	}
	if d.PayDB, err = pgxpool.New(ctx, st.PayDBURL()); err != nil {
		return nil, fmt.Errorf("paydb: %w", err)
	}
	if d.RailDB, err = pgxpool.New(ctx, st.RailDBURL()); err != nil {
		return nil, fmt.Errorf("raildb: %w", err)
	}
	if d.conn, err = grpc.NewClient(st.PubSubAddr(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		return nil, err
	}
	if d.ps, err = pubsub.NewClient(ctx, stack.PubSubProject, option.WithGRPCConn(d.conn)); err != nil {
		return nil, err
	}
	d.pub = payoutbus.NewPublisher(d.ps, stack.PubSubTopic)
	return d, nil
}

// Stack returns the driven stack.
func (d *Driver) Stack() *stack.Stack { return d.st }

// Close closes the clients and stops the stack. It may be called more
// than once.
func (d *Driver) Close() {
	d.closeOnce.Do(d.closeClients)
	d.st.Stop()
}

func (d *Driver) closeClients() {
	if d.pub != nil {
		d.pub.Stop()
	}
	if d.ps != nil {
		d.ps.Close()
	}
	if d.conn != nil {
		d.conn.Close()
	}
	if d.RailDB != nil {
		d.RailDB.Close()
	}
	if d.PayDB != nil {
		d.PayDB.Close()
	}
}

// Retry calls f until it succeeds, fails with an error that is not
// payment-resource being unavailable (it may be down: killed), or ctx
// ends. Each call may take 5 s; the pause between calls grows from 20 ms
// to 500 ms.
func Retry(ctx context.Context, f func(context.Context) error) error {
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

// CreateAccount creates an account at payment-resource (Retry).
func (d *Driver) CreateAccount(ctx context.Context, id, currency string, openingMinor int64) error {
	err := Retry(ctx, func(ctx context.Context) error {
		_, err := d.Pay.CreateAccount(ctx, api.AccountRequest{AccountID: id, Currency: currency, OpeningBalanceMinor: &openingMinor})
		return err
	})
	if err != nil {
		return fmt.Errorf("create account %s: %w", id, err)
	}
	return nil
}

// CreatePayout creates ev's payout at payment-resource (Retry), which
// publishes its event.
func (d *Driver) CreatePayout(ctx context.Context, ev payoutevent.Event) (api.Payout, error) {
	var p api.Payout
	err := Retry(ctx, func(ctx context.Context) error {
		var err error
		p, err = d.Pay.CreatePayout(ctx, api.PayoutRequest{PayoutID: ev.PayoutID, AccountID: ev.AccountID, AmountMinor: ev.AmountMinor, Currency: ev.Currency})
		return err
	})
	if err != nil {
		return p, fmt.Errorf("create payout %s: %w", ev.PayoutID, err)
	}
	return p, nil
}

// Load paces Driver.Load.
type Load struct {
	// Workers is the number of concurrent creations (>= 1).
	Workers int
	// Rate is in payouts per second; 0 creates them as fast as Workers go.
	Rate float64
	// Then, when set, runs after each payout was created (a duplicate
	// delivery, say); its error ends the load like a creation's.
	Then func(ctx context.Context, ev payoutevent.Event) error
}

// Load creates the payouts of evs in order, l.Workers at a time and paced
// by l.Rate, and returns at the first error or once all are created.
func (d *Driver) Load(ctx context.Context, evs []payoutevent.Event, l Load) error {
	jobs := make(chan payoutevent.Event)
	errs := make([]error, max(l.Workers, 1))
	var wg sync.WaitGroup
	for w := range errs {
		// Ends when jobs is closed or at its first error.
		wg.Go(func() {
			for ev := range jobs {
				if _, errs[w] = d.CreatePayout(ctx, ev); errs[w] == nil && l.Then != nil {
					errs[w] = l.Then(ctx, ev)
				}
				if errs[w] != nil {
					for range jobs { // drain, so the feeder is not blocked
					}
					return
				}
			}
		})
	}
	var tick <-chan time.Time
	if l.Rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / l.Rate))
		defer t.Stop()
		tick = t.C
	}
	var err error
feed:
	for i, ev := range evs {
		if tick != nil && i > 0 {
			select {
			case <-tick:
			case <-ctx.Done():
				err = ctx.Err()
				break feed
			}
		}
		select {
		case jobs <- ev:
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	return errors.Join(append(errs, err)...)
}

// Publish publishes ev as payment-resource's outbox does (same body,
// ordering key and attributes): one more delivery of the payout to some
// executor.
func (d *Driver) Publish(ctx context.Context, ev payoutevent.Event) error {
	data, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := d.pub.Publish(pctx, ev.AccountID, data, map[string]string{payoutevent.AttrPayoutID: ev.PayoutID, payoutevent.AttrAccountID: ev.AccountID}); err != nil {
		return fmt.Errorf("publish payout %s again: %w", ev.PayoutID, err)
	}
	return nil
}

// PullOne pulls the first message from the stack's subscription, within
// timeout, and acknowledges it: from then on the caller plays the push
// subscription, delivering and redelivering the message itself.
func (d *Driver) PullOne(ctx context.Context, timeout time.Duration) (*pubsub.Message, error) {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var got *pubsub.Message
	err := d.ps.Subscriber(stack.PubSubSubscription).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
		if got == nil {
			got = m
			m.Ack()
			cancel()
			return
		}
		m.Nack()
	})
	if got == nil {
		return nil, fmt.Errorf("no payout event on subscription %s: %v (%w)", stack.PubSubSubscription, err, rctx.Err())
	}
	return got, nil
}

// Audit is the verdict of the stack's records.
type Audit struct {
	// Journal is the rail-stub's journal: every submission the rail
	// received.
	Journal []rail.Submission
	// Report is payoutaudit.Run over the journal, raildb and paydb.
	Report payoutaudit.Report
}

// Audit reads the rail's journal from rail-stub and audits it against
// raildb and paydb (payoutaudit).
func (d *Driver) Audit(ctx context.Context) (Audit, error) {
	var a Audit
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.st.RailStubURL()+rail.PathJournal, nil)
	if err != nil {
		return a, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return a, fmt.Errorf("the rail's journal: %w", err)
	}
	var list rail.SubmissionList
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if err == nil && resp.StatusCode != http.StatusOK {
		err = errors.New(resp.Status)
	}
	if err != nil {
		return a, fmt.Errorf("the rail's journal: %w", err)
	}
	a.Journal = list.Submissions
	if a.Report, err = payoutaudit.Run(ctx, d.PayDB, d.RailDB, a.Journal, nil); err != nil {
		return a, fmt.Errorf("audit: %w", err)
	}
	return a, nil
}
