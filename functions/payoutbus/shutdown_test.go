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

	"cloud.google.com/go/pubsub/v2"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
)

// TestABridgeStoppedMidPushHandsTheMessageBack: a bridge stopped while a
// push is at the endpoint never acknowledges that message, even when the
// endpoint answers 2xx once the bridge has gone (the bridge did not see
// the answer, so it cannot know the message was processed), and hands it
// back at once: a second bridge receives it well before the
// subscription's ack deadline (600 s here) would have released it. At
// least once, across a shutdown.
func TestABridgeStoppedMidPushHandsTheMessageBack(t *testing.T) {
	c := fakePubSub(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := Setup(ctx, c, "local", "payouts", "payout-executor", 600*time.Second); err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		arrivals int
		first    = make(chan struct{})
		second   = make(chan struct{})
	)
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		mu.Lock()
		arrivals++
		n := arrivals
		mu.Unlock()
		switch n {
		case 1:
			close(first)
			<-r.Context().Done() // the bridge stopped while this push was here
		case 2:
			close(second)
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer endpoint.Close()
	run := func(ctx context.Context) chan error { return runBridge(ctx, c, endpoint.URL) }
	b1ctx, stop1 := context.WithCancel(ctx)
	b1 := run(b1ctx)
	pub := NewPublisher(c, "payouts")
	defer pub.Stop()
	ev := payoutevent.Event{PayoutID: "p-1", AccountID: "acct-7", AmountMinor: 2500, Currency: "EUR"}
	if err := pub.Publish(ctx, "acct-7", mustJSON(t, ev), map[string]string{payoutevent.AttrPayoutID: "p-1"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-first:
	case <-ctx.Done():
		t.Fatal("the first bridge never pushed the message")
	}
	stop1()
	if err := <-b1; err != nil {
		t.Fatalf("first bridge: %v", err)
	}
	secondBridgeGets(t, ctx, c, endpoint.URL, second, "the message pushed when the first bridge stopped did not reach the second bridge within 10 s: acknowledged, or left to its 600 s ack deadline")
}

// runBridge runs a push bridge of subscription payout-executor on c to
// endpoint until ctx ends; its Run's error arrives on the channel.
func runBridge(ctx context.Context, c *pubsub.Client, endpoint string) chan error {
	b := &PushBridge{Sub: c.Subscriber("payout-executor"), Admin: c.SubscriptionAdminClient, Endpoint: endpoint, Log: slog.New(slog.DiscardHandler)}
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	return done
}

// secondBridgeGets runs a second bridge until arrived is signalled (the
// endpoint saw the message again), failing with msg if that takes more
// than 10 s, then stops it.
func secondBridgeGets(t *testing.T, ctx context.Context, c *pubsub.Client, endpoint string, arrived <-chan struct{}, msg string) {
	t.Helper()
	bctx, stop := context.WithCancel(ctx)
	done := runBridge(bctx, c, endpoint)
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		stop()
		t.Fatal(msg)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("second bridge: %v", err)
	}
}
