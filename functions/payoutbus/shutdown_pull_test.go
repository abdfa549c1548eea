package payoutbus

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc"

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
	var stopOnPull pullStopper
	intercept := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		stopOnPull.after(reply, err, nil)
		return err
	}
	c := fakePubSubDial(t, []grpc.DialOption{grpc.WithUnaryInterceptor(intercept)})

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
	b1ctx, stop1 := context.WithCancel(ctx)
	stopOnPull.arm(stop1)
	b1 := runBridge(b1ctx, c, endpoint.URL)
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
	secondBridgeGets(t, ctx, c, endpoint.URL, pushed, "the message pulled as the first bridge stopped did not reach the second bridge within 10 s: left to its 600 s ack deadline")
	mu.Lock()
	defer mu.Unlock()
	if len(pushes) != 1 || pushes[0] != "second" {
		t.Errorf("pushes by %v; want one, by the second bridge", pushes)
	}
}

// pullStopper cancels a bridge, once armed, right after the server has
// answered one of its pulls with messages: the stop lands while that
// answer is on its way to the bridge.
type pullStopper struct {
	armed atomic.Pointer[context.CancelFunc]
}

// arm makes the next pull that brings messages call stop.
func (p *pullStopper) arm(stop context.CancelFunc) { p.armed.Store(&stop) }

// after is called by an interceptor with a call's reply and error; when
// armed and the reply is a pull that brought messages, it calls before
// (if not nil) with their number, then the stop.
func (p *pullStopper) after(reply any, err error, before func(messages int)) {
	r, ok := reply.(*pubsubpb.PullResponse)
	if !ok || err != nil || len(r.GetReceivedMessages()) == 0 {
		return
	}
	stop := p.armed.Swap(nil)
	if stop == nil {
		return
	}
	if before != nil {
		before(len(r.GetReceivedMessages()))
	}
	(*stop)()
}
