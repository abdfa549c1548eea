package payoutbus

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
)

// fakePubSub starts pstest and returns a client on it.
func fakePubSub(t *testing.T) *pubsub.Client { return fakePubSubDial(t, nil) }

// fakePubSubDial starts pstest with reactors opts and returns a client on
// it, connected with the dial options dial (for example an interceptor)
// besides plain-text credentials.
func fakePubSubDial(t *testing.T, dial []grpc.DialOption, opts ...pstest.ServerReactorOption) *pubsub.Client {
	t.Helper()
	srv := pstest.NewServer(opts...)
	t.Cleanup(func() { _ = srv.Close() })
	conn, err := grpc.NewClient(srv.Addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, dial...)...)
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

	bridge := &PushBridge{Sub: c.Subscriber("payout-executor"), Admin: c.SubscriptionAdminClient, Endpoint: endpoint.URL, Log: slog.New(slog.DiscardHandler)}
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

// TestPoisonMessageIsDeadLetteredAfterMaxAttempts: a message the endpoint
// always refuses is delivered MaxDeliveryAttempts times, then moved to the
// dead-letter topic (with Pub/Sub's dead-letter attributes), logged,
// counted and acknowledged: the next message of its ordering key, which
// Pub/Sub holds back until the poison one is acknowledged, then arrives,
// and the poison one was delivered no more.
func TestPoisonMessageIsDeadLetteredAfterMaxAttempts(t *testing.T) {
	// The subscription numbers the attempts when it has a dead-letter
	// policy (SetupDeadLetter); without one the bridge counts them.
	t.Run("numbered by the subscription", func(t *testing.T) { poisonIsDeadLettered(t, true) })
	t.Run("counted by the bridge", func(t *testing.T) { poisonIsDeadLettered(t, false) })
}

func poisonIsDeadLettered(t *testing.T, numbered bool) {
	c := fakePubSub(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := Setup(ctx, c, "local", "payouts", "payout-executor", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	const max = 3
	policyOn := "payout-executor"
	if !numbered { // the dead-letter topic exists, the subscription has no policy
		policyOn = "elsewhere"
		if err := Setup(ctx, c, "local", "payouts", policyOn, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if err := SetupDeadLetter(ctx, c, "local", "payouts", policyOn, DefaultMaxDeliveryAttempts); err != nil {
		t.Fatal(err)
	}
	wantAttempts := []string{"1", "2", "3"} // the push carries the bridge's count when the subscription has none
	var (
		mu       sync.Mutex
		pushes   = map[string]int{} // by payout id
		attempts []string
		good     = make(chan struct{})
	)
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		p, e, err := payoutevent.Decode(b)
		if err != nil {
			t.Errorf("push body does not decode: %v", err)
		}
		mu.Lock()
		defer mu.Unlock()
		pushes[e.PayoutID]++
		if e.PayoutID == "p-poison" {
			attempts = append(attempts, p.Attempt())
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		close(good)
	}))
	defer endpoint.Close()

	var logs bytes.Buffer
	var logMu sync.Mutex
	dlq := NewPublisher(c, DeadLetterTopic("payouts"))
	defer dlq.Stop()
	before := counterValue(t)
	bridge := &PushBridge{Sub: c.Subscriber("payout-executor"), Admin: c.SubscriptionAdminClient, Endpoint: endpoint.URL,
		Log:        slog.New(slog.NewJSONHandler(&lockedWriter{mu: &logMu, w: &logs}, nil)),
		DeadLetter: dlq, MaxDeliveryAttempts: max, Subscription: "payout-executor",
		Retry: RetryPolicy{Min: time.Millisecond, Max: 4 * time.Millisecond}}
	bctx, stop := context.WithCancel(ctx)
	bridgeDone := make(chan error, 1)
	go func() { bridgeDone <- bridge.Run(bctx) }()

	pub := NewPublisher(c, "payouts")
	defer pub.Stop()
	for _, id := range []string{"p-poison", "p-good"} {
		ev := payoutevent.Event{PayoutID: id, AccountID: "acct-7", AmountMinor: 2500, Currency: "EUR"}
		if err := pub.Publish(ctx, "acct-7", mustJSON(t, ev), map[string]string{payoutevent.AttrPayoutID: id}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-good:
	case <-ctx.Done():
		t.Fatalf("the message after the poison one never arrived: pushes %v", pushes)
	}
	stop()
	if err := <-bridgeDone; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if pushes["p-poison"] != max || !slices.Equal(attempts, wantAttempts) {
		t.Errorf("poison message pushed %d times with attempts %q; want %d (%q)", pushes["p-poison"], attempts, max, wantAttempts)
	}
	mu.Unlock()

	// The dead-letter subscription holds it, with the attributes.
	dctx, dcancel := context.WithCancel(ctx)
	var dead []*pubsub.Message
	err := c.Subscriber(DeadLetterTopic("payouts")).Receive(dctx, func(_ context.Context, m *pubsub.Message) {
		m.Ack()
		dead = append(dead, m)
		dcancel()
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != 1 || dead[0].Attributes[payoutevent.AttrPayoutID] != "p-poison" ||
		dead[0].Attributes[AttrDeadLetterDeliveryCount] != "3" || dead[0].Attributes[AttrDeadLetterSubscription] != "payout-executor" {
		t.Fatalf("dead-letter topic got %d messages: %+v", len(dead), dead)
	}
	if got := counterValue(t) - before; got != 1 {
		t.Errorf("payout_push_dead_lettered_total went up by %v; want 1", got)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if n := strings.Count(logs.String(), `"event":"push_dead_lettered"`); n != 1 || !strings.Contains(logs.String(), `"payoutId":"p-poison"`) {
		t.Errorf("push_dead_lettered lines: %d; want one naming p-poison\n%s", n, logs.String())
	}
}

func TestRetryPolicyDelay(t *testing.T) {
	p := RetryPolicy{Min: 5 * time.Second, Max: 300 * time.Second} // Terraform's
	for n, want := range []time.Duration{5, 10, 20, 40, 80, 160, 300, 300} {
		if got := p.Delay(n + 1); got != want*time.Second {
			t.Errorf("Delay(%d) = %v; want %v", n+1, got, want*time.Second)
		}
	}
	if got := p.Delay(200); got != 300*time.Second {
		t.Errorf("Delay(200) = %v; want the cap", got)
	}
	if got := (RetryPolicy{}).Delay(3); got != 0 {
		t.Errorf("zero policy Delay = %v; want 0", got)
	}
}

func counterValue(t *testing.T) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	for _, c := range Collectors() {
		if err := reg.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	fams, err := reg.Gather()
	if err != nil || len(fams) != 1 {
		t.Fatalf("gather: %v %v", fams, err)
	}
	return fams[0].GetMetric()[0].GetCounter().GetValue()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// A push the endpoint does not answer (a frozen executor) fails after the
// bridge's Timeout and the message is delivered again: the newcomer's
// probe 5 found the bridge waiting a fixed 60 s, so a stopped executor's
// payout did not reach the other one for a minute.
func TestAnUnansweredPushIsRedeliveredAfterTheTimeout(t *testing.T) {
	c := fakePubSub(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := Setup(ctx, c, "local", "payouts", "payout-executor", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		arrivals int
		second   = make(chan struct{})
		frozen   = make(chan struct{}) // the first push is held until the test ends
	)
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		mu.Lock()
		arrivals++
		n := arrivals
		mu.Unlock()
		if n == 1 {
			select {
			case <-frozen:
			case <-r.Context().Done():
			}
			return
		}
		w.WriteHeader(http.StatusNoContent)
		if n == 2 {
			close(second)
		}
	}))
	defer endpoint.Close()
	defer close(frozen)

	bridge := &PushBridge{Sub: c.Subscriber("payout-executor"), Admin: c.SubscriptionAdminClient, Endpoint: endpoint.URL, Log: slog.New(slog.DiscardHandler),
		Timeout: 300 * time.Millisecond}
	bctx, stop := context.WithCancel(ctx)
	bridgeDone := make(chan error, 1)
	go func() { bridgeDone <- bridge.Run(bctx) }()
	pub := NewPublisher(c, "payouts")
	defer pub.Stop()
	ev := payoutevent.Event{PayoutID: "p-1", AccountID: "acct-7", AmountMinor: 2500, Currency: "EUR"}
	if err := pub.Publish(ctx, "acct-7", mustJSON(t, ev), map[string]string{payoutevent.AttrPayoutID: "p-1"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-second:
	case <-ctx.Done():
		t.Fatalf("the unanswered push was not redelivered within 30 s with a Timeout of 300 ms")
	}
	stop()
	if err := <-bridgeDone; err != nil {
		t.Fatal(err)
	}
}

// The bridge's default push timeout is the ack deadline of the cloud's
// push subscription, read from terraform/main.tf.
func TestPushTimeoutIsTerraformsAckDeadline(t *testing.T) {
	b, err := os.ReadFile("../../terraform/main.tf")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*ack_deadline_seconds\s*=\s*(\d+)\s*$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("terraform/main.tf sets no ack_deadline_seconds local")
	}
	secs, _ := strconv.Atoi(string(m[1]))
	if got := DefaultPushTimeout; got != time.Duration(secs)*time.Second {
		t.Errorf("DefaultPushTimeout = %v; the cloud subscription's ack deadline is %d s", got, secs)
	}
}

// pullCounter is a pstest reactor that counts the Pull calls and handles
// none of them; wait blocks until the count reaches n.
type pullCounter struct {
	mu      sync.Mutex
	n       int
	changed chan struct{}
}

func newPullCounter() *pullCounter { return &pullCounter{changed: make(chan struct{})} }

func (p *pullCounter) React(any) (bool, any, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	close(p.changed)
	p.changed = make(chan struct{})
	return false, nil, nil
}

func (p *pullCounter) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

func (p *pullCounter) wait(ctx context.Context, n int) bool {
	for {
		p.mu.Lock()
		got, ch := p.n, p.changed
		p.mu.Unlock()
		if got >= n {
			return true
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

// fakePubSubWith is fakePubSub with pstest reactors.
func fakePubSubWith(t *testing.T, opts ...pstest.ServerReactorOption) *pubsub.Client {
	t.Helper()
	return fakePubSubDial(t, nil, opts...)
}

// TestBridgePushesOneKeyInOrderOneAtATime: the bridge acknowledges a
// message only after its 2xx, so the messages of one ordering key reach
// the endpoint in publish order and never two at once, a refused one
// (503) again before the next. Each push is held until the bridge has
// pulled three more times: had it acknowledged early, one of those pulls
// would have handed out the key's next message while this one was
// unanswered.
func TestBridgePushesOneKeyInOrderOneAtATime(t *testing.T) {
	pulls := newPullCounter()
	c := fakePubSubWith(t, pstest.ServerReactorOption{FuncName: "Pull", Reactor: pulls})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := Setup(ctx, c, "local", "payouts", "payout-executor", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	const n = 12
	var (
		mu         sync.Mutex
		inflight   int
		overlaps   []string
		order      []string
		refusedP5  bool
		delivered  = map[string]bool{}
		allArrived = make(chan struct{})
	)
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_, e, err := payoutevent.Decode(b)
		if err != nil {
			t.Errorf("push body does not decode: %v", err)
			return
		}
		mu.Lock()
		inflight++
		if inflight > 1 {
			overlaps = append(overlaps, e.PayoutID)
		}
		order = append(order, e.PayoutID)
		mu.Unlock()
		pulls.wait(r.Context(), pulls.count()+3)
		mu.Lock()
		defer mu.Unlock()
		inflight--
		if e.PayoutID == "p-5" && !refusedP5 {
			refusedP5 = true
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		delivered[e.PayoutID] = true
		if len(delivered) == n {
			close(allArrived)
		}
	}))
	defer endpoint.Close()

	bridge := &PushBridge{Sub: c.Subscriber("payout-executor"), Admin: c.SubscriptionAdminClient, Endpoint: endpoint.URL,
		Log: slog.New(slog.DiscardHandler)}
	bctx, stop := context.WithCancel(ctx)
	bridgeDone := make(chan error, 1)
	go func() { bridgeDone <- bridge.Run(bctx) }()
	pub := NewPublisher(c, "payouts")
	defer pub.Stop()
	var want []string
	for i := range n {
		id := "p-" + strconv.Itoa(i)
		want = append(want, id)
		if id == "p-5" {
			want = append(want, id) // refused once, then pushed again before p-6
		}
		ev := payoutevent.Event{PayoutID: id, AccountID: "acct-7", AmountMinor: 100, Currency: "EUR"}
		if err := pub.Publish(ctx, "acct-7", mustJSON(t, ev), map[string]string{payoutevent.AttrPayoutID: id}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-allArrived:
	case <-ctx.Done():
		mu.Lock()
		t.Fatalf("not every message was delivered: order %v, pushed while an earlier one of the key was unanswered: %v", order, overlaps)
	}
	stop()
	if err := <-bridgeDone; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(overlaps) > 0 {
		t.Errorf("pushed while an earlier message of the key was unanswered: %v", overlaps)
	}
	if !slices.Equal(order, want) {
		t.Errorf("push order %v; want %v", order, want)
	}
}

// BenchmarkBridgeOneOrderingKey is the hot account's ceiling set by the
// bridge alone: messages of one ordering key pushed per second to an
// endpoint that answers at once (metric msgs/s). Through
// Subscriber.Receive, whose acknowledgements leave in batches every
// 100 ms, it was about 10.
func BenchmarkBridgeOneOrderingKey(b *testing.B) {
	srv := pstest.NewServer()
	defer srv.Close()
	conn, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	c, err := pubsub.NewClient(b.Context(), "local", option.WithGRPCConn(conn))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := b.Context()
	if err := Setup(ctx, c, "local", "payouts", "payout-executor", 10*time.Second); err != nil {
		b.Fatal(err)
	}
	var (
		mu   sync.Mutex
		got  int
		done = make(chan struct{})
	)
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.WriteHeader(http.StatusNoContent)
		mu.Lock()
		defer mu.Unlock()
		if got++; got == b.N {
			close(done)
		}
	}))
	defer endpoint.Close()
	pub := NewPublisher(c, "payouts")
	defer pub.Stop()
	for i := range b.N {
		if err := pub.Publish(ctx, "acct-7", []byte(`{}`), map[string]string{payoutevent.AttrPayoutID: "p-" + strconv.Itoa(i)}); err != nil {
			b.Fatal(err)
		}
	}
	bridge := &PushBridge{Sub: c.Subscriber("payout-executor"), Admin: c.SubscriptionAdminClient, Endpoint: endpoint.URL,
		Log: slog.New(slog.DiscardHandler)}
	bctx, stop := context.WithCancel(ctx)
	bridgeDone := make(chan error, 1)
	b.ResetTimer()
	start := time.Now()
	go func() { bridgeDone <- bridge.Run(bctx) }()
	<-done
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	b.StopTimer()
	stop()
	if err := <-bridgeDone; err != nil {
		b.Fatal(err)
	}
}
