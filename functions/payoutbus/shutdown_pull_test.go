package payoutbus

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
)

// TestABridgeStoppedDuringAPullHandsTheMessagesBack: the bridge is
// stopped while a pull is on its way back with a message (a gRPC
// interceptor cancels the bridge's context once the server has answered,
// before the bridge sees the answer). That message was handed out to the
// bridge with the subscription's ack deadline (600 s here); the stopping
// bridge must hand it back at once, so that a second bridge pushes it
// within seconds. Before, the bridge returned with the answer unread and
// the message waited out its deadline.
func TestABridgeStoppedDuringAPullHandsTheMessagesBack(t *testing.T) {
	var stopOnPull atomic.Pointer[context.CancelFunc] // armed: cancel the bridge when a pull brings a message
	intercept := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if r, ok := reply.(*pubsubpb.PullResponse); ok && err == nil && len(r.GetReceivedMessages()) > 0 {
			if stop := stopOnPull.Swap(nil); stop != nil {
				(*stop)()
			}
		}
		return err
	}
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUnaryInterceptor(intercept))
	if err != nil {
		t.Fatal(err)
	}
	c, err := pubsub.NewClient(t.Context(), "local", option.WithGRPCConn(conn))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := Setup(ctx, c, "local", "payouts", "payout-executor", 600*time.Second); err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		pushes []string // the bridge ("first", "second") that pushed each message
		pushed = make(chan struct{}, 1)
		who    atomic.Value
	)
	who.Store("first")
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		mu.Lock()
		pushes = append(pushes, who.Load().(string))
		mu.Unlock()
		select {
		case pushed <- struct{}{}:
		default:
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer endpoint.Close()
	run := func(ctx context.Context) chan error {
		b := &PushBridge{Sub: c.Subscriber("payout-executor"), Admin: c.SubscriptionAdminClient, Endpoint: endpoint.URL, Log: slog.New(slog.DiscardHandler)}
		done := make(chan error, 1)
		go func() { done <- b.Run(ctx) }()
		return done
	}

	b1ctx, stop1 := context.WithCancel(ctx)
	stopOnPull.Store(&stop1)
	b1 := run(b1ctx)
	pub := NewPublisher(c, "payouts")
	defer pub.Stop()
	ev := payoutevent.Event{PayoutID: "p-1", AccountID: "acct-7", AmountMinor: 2500, Currency: "EUR"}
	if err := pub.Publish(ctx, "acct-7", mustJSON(t, ev), map[string]string{payoutevent.AttrPayoutID: "p-1"}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-b1:
		if err != nil {
			t.Fatalf("first bridge: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the first bridge never pulled the message")
	}
	mu.Lock()
	early := len(pushes)
	mu.Unlock()
	if early != 0 {
		t.Fatalf("the first bridge pushed %d messages after it was stopped during the pull; want none", early)
	}

	who.Store("second")
	b2ctx, stop2 := context.WithCancel(ctx)
	b2 := run(b2ctx)
	select {
	case <-pushed:
	case <-time.After(10 * time.Second):
		t.Fatal("the message pulled as the first bridge stopped did not reach the second bridge within 10 s: left to its 600 s ack deadline")
	}
	stop2()
	if err := <-b2; err != nil {
		t.Fatalf("second bridge: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(pushes) != 1 || pushes[0] != "second" {
		t.Errorf("pushes by %v; want one, by the second bridge", pushes)
	}
}
