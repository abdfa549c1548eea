package payoutbus

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
)

// TestAStalledServerHoldsAStoppingBridgeForOneCallBoundOnly: the bridge
// is stopped while a pull brings back several messages (of different
// accounts), and from then on Pub/Sub does not answer a hand-back
// (ModifyAckDeadline with deadline 0 never returns: a stalled server).
// Each call to Pub/Sub is bounded by callTimeout, so handing the pull's
// messages back may cost one bound; it must not cost one per message
// (the bridge would then stop after MaxOutstanding times 10 s at worst,
// beyond any termination grace period). Not parallel: it shortens
// callTimeout.
func TestAStalledServerHoldsAStoppingBridgeForOneCallBoundOnly(t *testing.T) {
	const messages = 5
	defer func(d time.Duration) { callTimeout = d }(callTimeout)
	callTimeout = 400 * time.Millisecond

	var (
		stopOnPull pullStopper
		pulled     atomic.Int64 // messages the stopping pull brought
		handBacks  atomic.Int64 // hand-back calls made
		stopped    atomic.Int64 // when the bridge was cancelled (UnixNano)
	)
	intercept := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if m, ok := req.(*pubsubpb.ModifyAckDeadlineRequest); ok && m.GetAckDeadlineSeconds() == 0 && stopped.Load() != 0 {
			handBacks.Add(1)
			<-ctx.Done() // stalled: no answer before the caller gives up
			return ctx.Err()
		}
		err := invoker(ctx, method, req, reply, cc, opts...)
		stopOnPull.after(reply, err, func(n int) {
			pulled.Store(int64(n))
			stopped.Store(time.Now().UnixNano())
		})
		return err
	}
	c := fakePubSubDial(t, []grpc.DialOption{grpc.WithUnaryInterceptor(intercept)})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := Setup(ctx, c, "local", "payouts", "payout-executor", 600*time.Second); err != nil {
		t.Fatal(err)
	}
	pub := NewPublisher(c, "payouts")
	defer pub.Stop()
	for i := range messages {
		acct := fmt.Sprintf("acct-%d", i)
		ev := payoutevent.Event{PayoutID: fmt.Sprintf("p-%d", i), AccountID: acct, AmountMinor: 100, Currency: "EUR"}
		if err := pub.Publish(ctx, acct, mustJSON(t, ev), map[string]string{payoutevent.AttrPayoutID: ev.PayoutID}); err != nil {
			t.Fatal(err)
		}
	}
	var pushes atomic.Int64
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pushes.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer endpoint.Close()

	bctx, stop := context.WithCancel(ctx)
	defer stop()
	stopOnPull.arm(stop)
	b := &PushBridge{Sub: c.Subscriber("payout-executor"), Admin: c.SubscriptionAdminClient, Endpoint: endpoint.URL, Log: slog.New(slog.DiscardHandler)}
	if err := b.Run(bctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	took := time.Since(time.Unix(0, stopped.Load()))
	if n := pulled.Load(); n < 2 {
		t.Fatalf("the stopping pull brought %d messages; the test needs several", n)
	}
	if n := pushes.Load(); n != 0 {
		t.Fatalf("%d messages pushed by a bridge stopped during their pull; want none", n)
	}
	if handBacks.Load() == 0 {
		t.Fatal("no hand-back was tried")
	}
	// One call bound for the hand-back, and as much again for scheduling
	// and the gRPC client's own work.
	if limit := 2 * callTimeout; took > limit {
		t.Fatalf("the bridge stopped %v after its context ended, with %d messages to hand back to a stalled server (%d hand-back calls, each bounded by %v); want at most %v",
			took.Round(time.Millisecond), pulled.Load(), handBacks.Load(), callTimeout, limit)
	}
}
