package payoutbus

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
)

// recordingDeadLetter is a DeadLetterPublisher that keeps what it is
// given and stores it, as the real topic would (its publish goes out
// whatever the caller's context does once it is handed to the client).
type recordingDeadLetter struct {
	mu   sync.Mutex
	msgs []map[string]string
}

func (d *recordingDeadLetter) Publish(_ context.Context, _ string, _ []byte, attrs map[string]string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.msgs = append(d.msgs, attrs)
	return nil
}

func (d *recordingDeadLetter) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.msgs)
}

// TestAStopDuringTheLastAttemptDoesNotDeadLetter: the bridge is stopped
// while it is pushing a message's last allowed delivery attempt (the
// endpoint has not answered). The push failed only because the bridge
// stopped: nobody answered it, so it is not a failed attempt. The
// message must be handed back (another bridge pushes it), not moved to
// the dead-letter topic and acknowledged, which would drop the payout
// from the pipeline until an operator replays it.
func TestAStopDuringTheLastAttemptDoesNotDeadLetter(t *testing.T) {
	c := fakePubSub(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := Setup(ctx, c, "local", "payouts", "payout-executor", 600*time.Second); err != nil {
		t.Fatal(err)
	}

	arrived, release := make(chan struct{}, 1), make(chan struct{})
	var (
		mu      sync.Mutex
		hang    = true // the first bridge's push is never answered
		answers int
	)
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body) // so that the server notices the client leave
		mu.Lock()
		h := hang
		mu.Unlock()
		if h {
			select {
			case arrived <- struct{}{}:
			default:
			}
			select { // until the bridge gives up the push
			case <-r.Context().Done():
			case <-release:
			}
			return
		}
		mu.Lock()
		answers++
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer endpoint.Close()
	defer close(release) // before the endpoint's Close, which waits for its handlers

	dlq := &recordingDeadLetter{}
	bridge := func() *PushBridge {
		return &PushBridge{Sub: c.Subscriber("payout-executor"), Admin: c.SubscriptionAdminClient, Endpoint: endpoint.URL,
			Log: slog.New(slog.DiscardHandler), DeadLetter: dlq, MaxDeliveryAttempts: 1, Subscription: "payout-executor"}
	}
	pub := NewPublisher(c, "payouts")
	defer pub.Stop()
	ev := payoutevent.Event{PayoutID: "p-last", AccountID: "acct-9", AmountMinor: 700, Currency: "EUR"}
	if err := pub.Publish(ctx, "acct-9", mustJSON(t, ev), map[string]string{payoutevent.AttrPayoutID: "p-last"}); err != nil {
		t.Fatal(err)
	}
	b1ctx, stop1 := context.WithCancel(ctx)
	done1 := make(chan error, 1)
	go func() { done1 <- bridge().Run(b1ctx) }()
	select {
	case <-arrived:
	case <-ctx.Done():
		t.Fatal("the first bridge never pushed the message")
	}
	stop1()
	if err := <-done1; err != nil {
		t.Fatalf("first bridge: %v", err)
	}
	if n := dlq.count(); n != 0 {
		t.Fatalf("%d dead-lettered: a push cut by the bridge's own stop was taken for a failed last attempt", n)
	}

	mu.Lock()
	hang = false
	mu.Unlock()
	b2ctx, stop2 := context.WithCancel(ctx)
	done2 := make(chan error, 1)
	go func() { done2 <- bridge().Run(b2ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := answers
		mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			stop2()
			<-done2
			t.Fatal("the message cut by the first bridge's stop did not reach the second bridge within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop2()
	if err := <-done2; err != nil {
		t.Fatalf("second bridge: %v", err)
	}
}
