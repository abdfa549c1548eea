package payoutbus

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
)

// fakePubSub starts pstest and returns a client on it.
func fakePubSub(t *testing.T) *pubsub.Client {
	t.Helper()
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	c, err := pubsub.NewClient(t.Context(), "local", option.WithGRPCConn(conn))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestBridgeDeliversLikePushAndRedeliversOnFailure publishes one event,
// answers the first delivery 503 and the second 204, and checks that the
// push bodies carry the event, the ordering key and the message id, and
// that the failed delivery was redelivered.
func TestBridgeDeliversLikePushAndRedeliversOnFailure(t *testing.T) {
	c := fakePubSub(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := Setup(ctx, c, "local", "payouts", "payout-executor", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	type got struct {
		push  payoutevent.Push
		event payoutevent.Event
	}
	var (
		mu     sync.Mutex
		pushes []got
		done   = make(chan struct{})
	)
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		p, e, err := payoutevent.Decode(b)
		if err != nil {
			t.Errorf("push body does not decode: %v: %s", err, b)
		}
		mu.Lock()
		defer mu.Unlock()
		pushes = append(pushes, got{p, e})
		if len(pushes) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		if len(pushes) == 2 {
			close(done)
		}
	}))
	defer endpoint.Close()

	bridge := &PushBridge{Sub: c.Subscriber("payout-executor"), Endpoint: endpoint.URL, Log: slog.New(slog.DiscardHandler)}
	bctx, stop := context.WithCancel(ctx)
	bridgeDone := make(chan error, 1)
	go func() { bridgeDone <- bridge.Run(bctx) }()

	pub := NewPublisher(c, "payouts")
	defer pub.Stop()
	ev := payoutevent.Event{PayoutID: "p-1", AccountID: "acct-7", AmountMinor: 2500, Currency: "EUR"}
	data, attrs := mustJSON(t, ev), map[string]string{payoutevent.AttrPayoutID: "p-1"}
	if err := pub.Publish(ctx, "acct-7", data, attrs); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("no redelivery after a 503: %d pushes", len(pushes))
	}
	stop()
	if err := <-bridgeDone; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, p := range pushes[:2] {
		if p.event != ev || p.push.Message.OrderingKey != "acct-7" || p.push.Message.MessageID == "" {
			t.Errorf("push %d = %+v %+v; want the event with ordering key acct-7 and a message id", i, p.push.Message, p.event)
		}
	}
	if pushes[0].push.Message.MessageID != pushes[1].push.Message.MessageID {
		t.Errorf("redelivery has another message id: %s, %s", pushes[0].push.Message.MessageID, pushes[1].push.Message.MessageID)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
