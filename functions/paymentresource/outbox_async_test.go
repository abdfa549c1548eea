package paymentresource_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
)

// asyncPublisher is a paymentresource.AsyncPublisher whose messages for
// the payouts in fail are never acknowledged; every other one is.
type asyncPublisher struct {
	fail map[string]bool
	mu   sync.Mutex
	seen []string // payout ids, in call order
}

var _ paymentresource.AsyncPublisher = (*asyncPublisher)(nil)

func (p *asyncPublisher) Publish(context.Context, string, []byte, map[string]string) error {
	return errors.New("the outbox must use PublishAsync when the publisher has it")
}

func (p *asyncPublisher) PublishAsync(_ context.Context, _ string, _ []byte, attrs map[string]string) func(context.Context) error {
	id := attrs[payoutevent.AttrPayoutID]
	p.mu.Lock()
	p.seen = append(p.seen, id)
	p.mu.Unlock()
	return func(context.Context) error {
		if p.fail[id] {
			return errBrokerDown
		}
		return nil
	}
}

func (p *asyncPublisher) saw(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Contains(p.seen, id)
}

// With an asynchronous publisher the outbox marks every acknowledged row,
// except one acknowledged after an unacknowledged row of the same
// ordering key (account): p-3 follows the failed p-1 on acct-1 and stays
// unpublished, so the next pass sends acct-1's rows again from p-1; acct-2's
// rows are not held up by acct-1's failure.
func TestOutboxAsyncMarksNothingPastAFailureOfTheSameKey(t *testing.T) {
	t.Parallel()
	pub := &asyncPublisher{fail: map[string]bool{"p-1": true}}
	f := newFixture(t, pub)
	f.createAccount("acct-1", "EUR", 1_000)
	f.createAccount("acct-2", "EUR", 1_000)
	for _, w := range [][2]string{{"p-1", "acct-1"}, {"p-2", "acct-2"}, {"p-3", "acct-1"}, {"p-4", "acct-2"}} {
		f.createPayout(w[0], w[1], 10, "EUR")
	}
	published := func() map[string]bool {
		rows, err := f.db.Query(context.Background(), `SELECT attrs->>$1, published_at IS NOT NULL FROM outbox`, payoutevent.AttrPayoutID)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]bool{}
		for rows.Next() {
			var id string
			var done bool
			if err := rows.Scan(&id, &done); err != nil {
				t.Fatal(err)
			}
			out[id] = done
		}
		return out
	}
	deadline := time.Now().Add(waitLimit)
	for !(pub.saw("p-3") && published()["p-2"] && published()["p-4"]) {
		if time.Now().After(deadline) {
			t.Fatalf("outbox after %v: published %v, publisher saw %v", waitLimit, published(), pub.seen)
		}
		time.Sleep(10 * time.Millisecond)
	}
	f.svc.Close() // waits for the pass in flight
	got := published()
	want := map[string]bool{"p-1": false, "p-2": true, "p-3": false, "p-4": true}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("outbox row of %s published = %v, want %v (all: %v)", id, got[id], w, got)
		}
	}
}
