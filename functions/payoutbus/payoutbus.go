// Package payoutbus carries payout events over Pub/Sub
// (cloud.google.com/go/pubsub/v2): a Publisher that payment-resource's
// outbox drains into, topic and subscription setup with message ordering
// by account, and a PushBridge that delivers pulled messages to the
// executor's HTTP endpoint as a push subscription would post them, ordering
// key and delivery attempt included. The bridge exists because the
// in-process fake (pstest) has no push delivery; like the subscription
// Terraform creates, it acknowledges after a 2xx only, redelivers with the
// retry policy and dead-letters after the maximum delivery attempts.
package payoutbus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	vkit "cloud.google.com/go/pubsub/v2/apiv1"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonclient"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
)

// Publisher publishes payout events with message ordering on. It satisfies
// paymentresource.Publisher.
type Publisher struct {
	p *pubsub.Publisher
}

// NewPublisher returns a Publisher on topic (an id or a full name) of c.
func NewPublisher(c *pubsub.Client, topic string) *Publisher {
	p := c.Publisher(topic)
	p.EnableMessageOrdering = true
	return &Publisher{p: p}
}

// Publish sends one message and blocks until Pub/Sub has stored it, or ctx
// ends. After a failure on an ordering key Pub/Sub pauses that key; Publish
// resumes it so that the outbox's next attempt can go through.
func (p *Publisher) Publish(ctx context.Context, orderingKey string, data []byte, attrs map[string]string) error {
	res := p.p.Publish(ctx, &pubsub.Message{Data: data, Attributes: attrs, OrderingKey: orderingKey})
	if _, err := res.Get(ctx); err != nil {
		p.p.ResumePublish(orderingKey)
		return fmt.Errorf("payoutbus: publish: %w", err)
	}
	return nil
}

// PublishAsync hands one message to the client and returns at once; wait
// blocks until Pub/Sub has stored it (nil) or it failed, or ctx ends, and
// after a failure resumes the ordering key so that a later attempt can go
// through. Messages of one ordering key are sent in call order, and once
// one fails every later one of the key fails until it is resumed (the
// client's ordering guarantee). It satisfies
// paymentresource.AsyncPublisher: the outbox publishes a batch of rows
// with one bundle instead of one request and one DelayThreshold (10 ms)
// per row.
func (p *Publisher) PublishAsync(ctx context.Context, orderingKey string, data []byte, attrs map[string]string) (wait func(context.Context) error) {
	res := p.p.Publish(ctx, &pubsub.Message{Data: data, Attributes: attrs, OrderingKey: orderingKey})
	return func(ctx context.Context) error {
		if _, err := res.Get(ctx); err != nil {
			p.p.ResumePublish(orderingKey)
			return fmt.Errorf("payoutbus: publish: %w", err)
		}
		return nil
	}
}

// Stop flushes and stops the publisher.
func (p *Publisher) Stop() { p.p.Stop() }

// Setup creates the topic and a pull subscription with message ordering,
// if they do not exist. project is the Google Cloud project id; ackDeadline
// is how long a delivery may take before Pub/Sub redelivers it.
func Setup(ctx context.Context, c *pubsub.Client, project, topic, sub string, ackDeadline time.Duration) error {
	topicName := fmt.Sprintf("projects/%s/topics/%s", project, topic)
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: topicName}); err != nil && status.Code(err) != codes.AlreadyExists {
		return fmt.Errorf("payoutbus: create topic %s: %w", topicName, err)
	}
	subName := fmt.Sprintf("projects/%s/subscriptions/%s", project, sub)
	_, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name:                  subName,
		Topic:                 topicName,
		AckDeadlineSeconds:    int32(ackDeadline / time.Second),
		EnableMessageOrdering: true,
	})
	if err != nil && status.Code(err) != codes.AlreadyExists {
		return fmt.Errorf("payoutbus: create subscription %s: %w", subName, err)
	}
	return nil
}

// DefaultMaxDeliveryAttempts is the dead-letter policy of the executor's
// push subscription in terraform/modules/pubsub (max_delivery_attempts):
// the delivery attempts of one message before it goes to the dead-letter
// topic.
const DefaultMaxDeliveryAttempts = 10

// DefaultPushTimeout is how long a PushBridge waits for the endpoint's
// answer to one push: the ack deadline of the executor's push subscription
// in terraform/main.tf (local.ack_deadline_seconds, 120 s). A push
// subscription treats a push unanswered within its ack deadline as not
// acknowledged and redelivers the message (to any instance); the bridge
// then does the same, so a frozen executor's message reaches another one
// after as long as it would on the cloud (TestPushTimeoutIsTerraformsAckDeadline
// keeps the two equal).
const DefaultPushTimeout = 120 * time.Second

// DeadLetterTopic returns the id of the dead-letter topic of topic, named
// as Terraform names it ("<topic>-dead-letter"); its subscription has the
// same id.
func DeadLetterTopic(topic string) string { return topic + "-dead-letter" }

// Attributes a dead-lettered message carries besides its own, as Pub/Sub
// adds them when it forwards a message to a dead-letter topic.
const (
	// AttrDeadLetterDeliveryCount is the number of delivery attempts made.
	AttrDeadLetterDeliveryCount = "CloudPubSubDeadLetterSourceDeliveryCount"
	// AttrDeadLetterSubscription is the subscription it came from.
	AttrDeadLetterSubscription = "CloudPubSubDeadLetterSourceSubscription"
)

// SetupDeadLetter creates the dead-letter topic of topic and a
// subscription on it (both DeadLetterTopic(topic)), so that dead-lettered
// messages are kept for an operator, and gives sub a dead-letter policy of
// maxAttempts delivery attempts (DefaultMaxDeliveryAttempts when 0); with
// it Pub/Sub (and pstest) numbers the delivery attempts. Existing topics
// and subscriptions are kept.
func SetupDeadLetter(ctx context.Context, c *pubsub.Client, project, topic, sub string, maxAttempts int) error {
	if maxAttempts <= 0 {
		maxAttempts = DefaultMaxDeliveryAttempts
	}
	dlName := fmt.Sprintf("projects/%s/topics/%s", project, DeadLetterTopic(topic))
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: dlName}); err != nil && status.Code(err) != codes.AlreadyExists {
		return fmt.Errorf("payoutbus: create topic %s: %w", dlName, err)
	}
	dlSub := fmt.Sprintf("projects/%s/subscriptions/%s", project, DeadLetterTopic(topic))
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: dlSub, Topic: dlName}); err != nil &&
		status.Code(err) != codes.AlreadyExists {
		return fmt.Errorf("payoutbus: create subscription %s: %w", dlSub, err)
	}
	subName := fmt.Sprintf("projects/%s/subscriptions/%s", project, sub)
	_, err := c.SubscriptionAdminClient.UpdateSubscription(ctx, &pubsubpb.UpdateSubscriptionRequest{
		Subscription: &pubsubpb.Subscription{Name: subName, DeadLetterPolicy: &pubsubpb.DeadLetterPolicy{
			DeadLetterTopic: dlName, MaxDeliveryAttempts: int32(maxAttempts),
		}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"dead_letter_policy"}},
	})
	if err != nil {
		return fmt.Errorf("payoutbus: set the dead-letter policy of %s: %w", subName, err)
	}
	return nil
}

// RetryPolicy is a subscription's redelivery backoff: the wait before
// the redelivery that follows failed attempt n is Min * 2^(n-1), capped
// at Max. The zero value redelivers at once (pstest's own behaviour).
// Terraform's subscription uses Min 5 s, Max 300 s.
type RetryPolicy struct {
	// Min is the wait after the first failed attempt.
	Min time.Duration
	// Max caps every wait.
	Max time.Duration
}

// Delay returns the wait after failed attempt n (1 for the first).
func (p RetryPolicy) Delay(n int) time.Duration {
	if p.Min <= 0 {
		return 0
	}
	if n < 1 {
		n = 1
	}
	d := p.Max
	if n <= 32 {
		if step := p.Min << (n - 1); step > 0 && step < p.Max {
			d = step
		}
	}
	return max(d, p.Min)
}

// deadLettered counts the messages the bridges moved to a dead-letter
// topic.
var deadLettered = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "payout_push_dead_lettered_total",
	Help: "Payout messages moved to the dead-letter topic by the local push bridge after their last delivery attempt failed.",
})

// Collectors returns the bridge's metric, payout_push_dead_lettered_total
// (no labels), for a registry.
func Collectors() []prometheus.Collector { return []prometheus.Collector{deadLettered} }

// DeadLetterPublisher publishes a dead-lettered message; *Publisher on the
// DeadLetterTopic implements it.
type DeadLetterPublisher interface {
	Publish(ctx context.Context, orderingKey string, data []byte, attrs map[string]string) error
}

// DefaultMaxOutstanding is how many messages a PushBridge has in flight
// at most: the v2 client's default MaxOutstandingMessages.
const DefaultMaxOutstanding = 1000

// DefaultPollInterval is how long a PushBridge waits before pulling again
// after a pull found nothing: pstest's own delivery tick to streaming
// subscribers (10 ms).
const DefaultPollInterval = 10 * time.Millisecond

// maxIdlePoll caps the growing wait between the pulls of an idle bridge
// (PushBridge.PollInterval doubles after each pull that found nothing and
// no answered message cut the wait short): an idle bridge costs Pub/Sub
// twenty pulls a second, and a new message waits at most this long.
const maxIdlePoll = 50 * time.Millisecond

// maxErrorWait caps the growing wait after failed pulls (Pub/Sub
// restarting or unreachable), so that an outage is not a busy loop of
// warnings.
const maxErrorWait = time.Second

// PushBridge pulls from a subscription and posts each message, wrapped as a
// Pub/Sub push request, to an HTTP endpoint. It acknowledges each message
// right after its 2xx, as a push subscription does, through the raw API
// rather than Subscriber.Receive, whose 100 ms acknowledgement batches cap
// one ordering key at 10 messages/s (docs/benchmarks.md). At most
// MaxOutstanding messages are in flight, each one's ack deadline extended
// until it is answered, so only Timeout and the retry policy decide when a
// message is delivered again.
type PushBridge struct {
	// Sub names the subscription to pull from (Sub.String(), the full
	// name); the bridge does not call its Receive.
	Sub *pubsub.Subscriber
	// Admin is the raw API the bridge pulls and acknowledges through:
	// the SubscriptionAdminClient of the client Sub belongs to.
	Admin *vkit.SubscriptionAdminClient
	// Endpoint receives the push requests (the executor's URL).
	Endpoint string
	// Doer sends the requests; default an http.Client with Timeout whose
	// transport keeps up to MaxOutstanding idle connections to the
	// endpoint (net/http's default keeps 2, so concurrent pushes would
	// open and close a connection each).
	Doer interface {
		Do(*http.Request) (*http.Response, error)
	}
	// Timeout bounds each push when Doer is nil: an endpoint that has not
	// answered by then (a frozen executor) fails the delivery, and the
	// message is redelivered. Default DefaultPushTimeout, the cloud
	// subscription's ack deadline.
	Timeout time.Duration
	// Copies, when set, returns how many times to post one delivery and
	// whether the copies go at once (concurrently) or one after another. It
	// lets tests make every message arrive two or three times, some copies
	// concurrent, as at-least-once delivery may. The delivery is
	// acknowledged when every copy was answered 2xx. Default: one copy.
	Copies func(messageID string) (n int, concurrent bool)
	// Log receives one line per delivery.
	Log *slog.Logger
	// DeadLetter, when set, receives a message whose delivery attempt
	// MaxDeliveryAttempts failed; the message is then acknowledged, logged
	// (push_dead_lettered) and counted (payout_push_dead_lettered_total).
	// Nil: no dead-letter policy, a failed message is redelivered without
	// limit.
	DeadLetter DeadLetterPublisher
	// MaxDeliveryAttempts bounds the delivery attempts of one message when
	// DeadLetter is set (default DefaultMaxDeliveryAttempts, Terraform's).
	// The attempt is the message's DeliveryAttempt (set by a subscription
	// with a dead-letter policy: SetupDeadLetter), or else counted by this
	// bridge alone.
	MaxDeliveryAttempts int
	// Subscription is the subscription's name, for the dead-lettered
	// message's AttrDeadLetterSubscription.
	Subscription string
	// Retry is the wait before a failed message is handed back for
	// redelivery (default: none).
	Retry RetryPolicy
	// MaxOutstanding bounds the messages in flight (default
	// DefaultMaxOutstanding).
	MaxOutstanding int
	// PollInterval is the wait before the next pull after one that found
	// nothing (default DefaultPollInterval), doubled after each further
	// empty pull up to 50 ms; an answered message, which may release its
	// key's next message, ends the wait at once.
	PollInterval time.Duration

	mu       sync.Mutex
	attempts map[string]int      // by message id, when the subscription does not number them
	inflight map[string]struct{} // ack ids being delivered, for the deadline extension
}

// Run delivers until ctx ends; it returns nil then, or the first error of
// the subscription that a retry cannot change (it does not exist, the
// request is refused). It waits for the deliveries in flight before it
// returns.
func (b *PushBridge) Run(ctx context.Context) error {
	if b.Sub == nil || b.Admin == nil || b.Endpoint == "" || b.Log == nil {
		return errors.New("payoutbus: PushBridge needs Sub, Admin, Endpoint and Log")
	}
	maxOut := b.MaxOutstanding
	if maxOut <= 0 {
		maxOut = DefaultMaxOutstanding
	}
	poll := b.PollInterval
	if poll <= 0 {
		poll = DefaultPollInterval
	}
	doer := b.Doer
	if doer == nil {
		timeout := b.Timeout
		if timeout <= 0 {
			timeout = DefaultPushTimeout
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = maxOut
		defer tr.CloseIdleConnections()
		doer = &http.Client{Timeout: timeout, Transport: tr}
	}
	sub := b.Sub.String()
	s, err := b.Admin.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: sub})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("payoutbus: subscription %s: %w", sub, err)
	}
	deadline := time.Duration(s.GetAckDeadlineSeconds()) * time.Second
	if deadline <= 0 {
		deadline = 10 * time.Second // Pub/Sub's default
	}

	var (
		wg    sync.WaitGroup
		slots = make(chan struct{}, maxOut)
		kick  = make(chan struct{}, 1) // a message was answered: pull again now
	)
	defer wg.Wait()
	idle := poll    // the wait after an empty pull: doubles while nothing comes, up to maxIdlePoll
	errWait := poll // the wait after a failed pull: doubles while pulls fail, up to maxErrorWait
	// Extends the in-flight messages' deadlines; ends with ctx.
	wg.Go(func() { b.keepAlive(ctx, sub, deadline) })
	for {
		free := maxOut - len(slots)
		if free > 0 {
			// ReturnImmediately: the bridge waits for its own kick or poll
			// instead of the server's long poll (pstest's is a fixed 500 ms
			// that an acknowledgement does not cut short).
			resp, err := b.pull(ctx, sub, free)
			switch {
			case ctx.Err() != nil:
				// Stopped during the pull: what it received goes back at
				// once, not after its ack deadline, in one bound whatever
				// their number (a stalled server must not hold the stop
				// for a bound per message).
				ids := make([]string, 0, len(resp.GetReceivedMessages()))
				for _, rm := range resp.GetReceivedMessages() {
					ids = append(ids, rm.GetAckId())
				}
				b.handBack(ctx, sub, ids)
				return nil
			case err != nil && !retryable(err):
				return fmt.Errorf("payoutbus: pull %s: %w", sub, err)
			case err != nil:
				b.Log.Warn("push bridge pull failed; pulling again", "event", EventPushPullFailed, "error", err.Error(), "retryIn", errWait)
				idle, errWait = errWait, min(2*errWait, maxErrorWait)
			default:
				errWait = poll
			}
			for _, rm := range resp.GetReceivedMessages() {
				slots <- struct{}{}
				b.track(rm.GetAckId(), true)
				// Ends when the message was answered and acknowledged or
				// handed back.
				wg.Go(func() {
					defer func() {
						<-slots
						select {
						case kick <- struct{}{}:
						default:
						}
					}()
					b.handle(ctx, doer, sub, rm)
				})
			}
			if len(resp.GetReceivedMessages()) > 0 {
				idle = poll
				continue
			}
		}
		t := time.NewTimer(idle)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-kick:
			t.Stop()
		case <-t.C:
			idle = min(2*idle, maxIdlePoll)
		}
	}
}

// callTimeout bounds each call the bridge makes to Pub/Sub outside its
// context (a pull, an acknowledgement, a hand-back): they return at once
// (the pull with ReturnImmediately), so only a stalled Pub/Sub server
// reaches the bound. A variable so that tests of a stalled server need
// not wait 10 s per call.
var callTimeout = 10 * time.Second

// pull asks for up to n messages of sub. The request does not end with
// ctx: a pull cut short as the bridge stops could leave messages handed
// out to it whose answer never arrives, and those would wait for their
// ack deadline (120 s in the cloud) before anyone else got them. Run
// hands back what a pull returns after ctx has ended.
func (b *PushBridge) pull(ctx context.Context, sub string, n int) (*pubsubpb.PullResponse, error) {
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
	defer cancel()
	//lint:ignore SA1019 deprecated for the cloud, where push replaces this bridge; pstest and the emulator honour it
	return b.Admin.Pull(pctx, &pubsubpb.PullRequest{Subscription: sub, MaxMessages: int32(n), ReturnImmediately: true})
}

// handle delivers one pulled message and then acknowledges it (every copy
// answered 2xx, or it went to the dead-letter topic) or hands it back for
// redelivery after the retry policy's wait, or at once when the bridge is
// stopping (a failure then may be the stop's own doing: never a reason to
// dead-letter).
func (b *PushBridge) handle(ctx context.Context, doer interface {
	Do(*http.Request) (*http.Response, error)
}, sub string, rm *pubsubpb.ReceivedMessage) {
	m := rm.GetMessage()
	ackID := rm.GetAckId()
	attempt := b.attempt(m.GetMessageId(), int(rm.GetDeliveryAttempt()))
	body, err := payoutevent.EncodeRaw(m.GetData(), m.GetAttributes(), m.GetMessageId(), m.GetOrderingKey(), attempt)
	if err != nil {
		b.Log.Error("push bridge cannot wrap a message; acking it", "event", EventPushBridgeUnwrappable, "messageId", m.GetMessageId(), "error", err.Error())
		b.ack(ctx, sub, ackID)
		return
	}
	n, concurrent := 1, false
	if b.Copies != nil {
		n, concurrent = b.Copies(m.GetMessageId())
	}
	ok := b.deliver(ctx, doer, m.GetMessageId(), body, max(n, 1), concurrent)
	switch {
	case !ok && ctx.Err() != nil:
		// The bridge is stopping: its own stop may have cut the push, so
		// the attempt says nothing about the endpoint. Handed back at
		// once, never dead-lettered.
		b.nack(ctx, sub, ackID)
	case ok:
		b.forget(m.GetMessageId())
		b.ack(ctx, sub, ackID)
	case b.DeadLetter != nil && attempt >= b.maxAttempts():
		if err := b.deadLetter(ctx, m, attempt); err != nil {
			b.Log.Error("push bridge cannot dead-letter a message; it will be redelivered", "event", EventPushDeadLetterFailed,
				"messageId", m.GetMessageId(), "deliveryAttempt", attempt, "error", err.Error())
			b.nack(ctx, sub, ackID)
			return
		}
		b.forget(m.GetMessageId())
		b.ack(ctx, sub, ackID)
	default:
		t := time.NewTimer(b.Retry.Delay(attempt))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		b.nack(ctx, sub, ackID)
	}
}

// ack acknowledges ackID now, even when ctx has ended (the push was
// answered: a redelivery would only be a duplicate). A failed
// acknowledgement is logged; the message is then delivered again after
// its deadline, which at-least-once delivery allows.
func (b *PushBridge) ack(ctx context.Context, sub, ackID string) {
	b.track(ackID, false)
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
	defer cancel()
	if err := b.Admin.Acknowledge(actx, &pubsubpb.AcknowledgeRequest{Subscription: sub, AckIds: []string{ackID}}); err != nil {
		b.Log.Warn("push bridge acknowledgement failed; the message will be delivered again", "event", EventPushAckFailed, "ackId", ackID, "error", err.Error())
	}
}

// nack hands ackID back for redelivery now (a deadline of 0, as the
// client's Nack does); if that fails, its deadline hands it back later.
func (b *PushBridge) nack(ctx context.Context, sub, ackID string) {
	b.track(ackID, false)
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
	defer cancel()
	if err := b.Admin.ModifyAckDeadline(actx, &pubsubpb.ModifyAckDeadlineRequest{Subscription: sub, AckIds: []string{ackID}, AckDeadlineSeconds: 0}); err != nil {
		b.Log.Warn("push bridge could not hand a message back; its deadline will", "event", EventPushNackFailed, "ackId", ackID, "error", err.Error())
	}
}

// maxAckIDsPerCall is the most ack ids the bridge sends in one
// ModifyAckDeadline request (the request stays far under Pub/Sub's
// 512 KB limit).
const maxAckIDsPerCall = 1000

// handBack hands every one of ids back for redelivery now, as nack does
// for one, never tracked as in flight. The requests (one per
// maxAckIDsPerCall ids) go at once, each bounded by callTimeout, so
// handBack returns within one bound however many ids there are; an id
// whose request failed is delivered again after its deadline.
func (b *PushBridge) handBack(ctx context.Context, sub string, ids []string) {
	var wg sync.WaitGroup
	for len(ids) > 0 {
		batch := ids[:min(len(ids), maxAckIDsPerCall)]
		ids = ids[len(batch):]
		wg.Go(func() {
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
			defer cancel()
			if err := b.Admin.ModifyAckDeadline(actx, &pubsubpb.ModifyAckDeadlineRequest{Subscription: sub, AckIds: batch, AckDeadlineSeconds: 0}); err != nil {
				b.Log.Warn("push bridge could not hand messages back; their deadline will", "event", EventPushNackFailed, "messages", len(batch), "error", err.Error())
			}
		})
	}
	wg.Wait()
}

// keepAlive extends the deadline of every message in flight by deadline,
// every half deadline, until ctx ends.
func (b *PushBridge) keepAlive(ctx context.Context, sub string, deadline time.Duration) {
	t := time.NewTicker(deadline / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		b.extend(ctx, sub, deadline)
	}
}

// extend sends the deadline extension of every message in flight. It
// holds b.mu throughout, so that a message dropped from the set (track)
// before its acknowledgement or hand-back cannot get an extension after
// it: a late extension would hold back a handed-back message.
func (b *PushBridge) extend(ctx context.Context, sub string, deadline time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ids := make([]string, 0, len(b.inflight))
	for id := range b.inflight {
		ids = append(ids, id)
	}
	for len(ids) > 0 {
		batch := ids[:min(len(ids), 1000)]
		ids = ids[len(batch):]
		// Bounded, so that a stopped Pub/Sub server does not hold b.mu.
		ectx, cancel := context.WithTimeout(ctx, deadline/4)
		err := b.Admin.ModifyAckDeadline(ectx, &pubsubpb.ModifyAckDeadlineRequest{Subscription: sub, AckIds: batch, AckDeadlineSeconds: int32(deadline / time.Second)})
		cancel()
		if err != nil && ctx.Err() == nil {
			b.Log.Warn("push bridge could not extend the deadlines of the messages in flight", "event", EventPushExtendFailed, "messages", len(batch), "error", err.Error())
		}
	}
}

// track adds ackID to, or drops it from, the messages in flight.
func (b *PushBridge) track(ackID string, add bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inflight == nil {
		b.inflight = map[string]struct{}{}
	}
	if add {
		b.inflight[ackID] = struct{}{}
	} else {
		delete(b.inflight, ackID)
	}
}

// retryable reports whether a failed pull may succeed when tried again
// (the server is restarting, stopped or overloaded).
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted, codes.Internal, codes.Unknown, codes.Canceled:
		return true
	}
	return false
}

// attempt is a message's delivery attempt: delivery (the message's
// DeliveryAttempt) when the subscription numbers them, or this bridge's
// own count of message id.
func (b *PushBridge) attempt(id string, delivery int) int {
	if delivery > 0 {
		return delivery
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.attempts == nil {
		b.attempts = map[string]int{}
	}
	b.attempts[id]++
	return b.attempts[id]
}

// forget drops the bridge's count of message id.
func (b *PushBridge) forget(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.attempts, id)
}

func (b *PushBridge) maxAttempts() int {
	if b.MaxDeliveryAttempts > 0 {
		return b.MaxDeliveryAttempts
	}
	return DefaultMaxDeliveryAttempts
}

// deadLetter publishes m to DeadLetter with Pub/Sub's dead-letter
// attributes, then logs and counts it.
func (b *PushBridge) deadLetter(ctx context.Context, m *pubsubpb.PubsubMessage, attempt int) error {
	attrs := make(map[string]string, len(m.GetAttributes())+2)
	for k, v := range m.GetAttributes() {
		attrs[k] = v
	}
	attrs[AttrDeadLetterDeliveryCount] = strconv.Itoa(attempt)
	attrs[AttrDeadLetterSubscription] = b.Subscription
	if err := b.DeadLetter.Publish(ctx, m.GetOrderingKey(), m.GetData(), attrs); err != nil {
		return err
	}
	deadLettered.Inc()
	b.Log.Error("message moved to the dead-letter topic after its last delivery attempt failed", "event", EventPushDeadLettered,
		"messageId", m.GetMessageId(), "orderingKey", m.GetOrderingKey(), "deliveryAttempt", attempt,
		"payoutId", m.GetAttributes()[payoutevent.AttrPayoutID], "accountId", m.GetAttributes()[payoutevent.AttrAccountID])
	return nil
}

// deliver posts body n times and reports whether every answer was 2xx.
func (b *PushBridge) deliver(ctx context.Context, doer interface {
	Do(*http.Request) (*http.Response, error)
}, id string, body []byte, n int, concurrent bool) bool {
	var (
		mu  sync.Mutex
		all = true
		wg  sync.WaitGroup
	)
	post := func(copy int) {
		status, code, err := b.post(ctx, doer, body)
		failed := err != nil || status/100 != 2
		// A 2xx restates the executor's own outcome line: DEBUG.
		level := slog.LevelDebug
		if failed {
			level = slog.LevelInfo
		}
		// "error" right after "status": the runbook of PayoutDeadLettered
		// and the game day's executor-down check read "status":0,"error":.
		b.Log.Log(ctx, level, "push delivered", "event", EventPushDelivered, "messageId", id, "copy", copy, "status", status, "error", errString(err), "code", code)
		mu.Lock()
		defer mu.Unlock()
		if failed {
			all = false
		}
	}
	for i := range n {
		if concurrent {
			wg.Go(func() { post(i + 1) })
		} else {
			post(i + 1)
		}
	}
	wg.Wait()
	return all
}

// maxRefusalBytes bounds how much of a non-2xx answer post reads for the
// log (the error envelope is a few hundred bytes).
const maxRefusalBytes = 4 << 10

// post sends one push and returns the answer's status, 0 when there was
// none. For a non-2xx answer it also returns the error envelope's code
// (internal/jsonhandler; "" when the body is not the envelope) and an error
// that says what the endpoint answered ("answered 503
// DEPENDENCY_UNAVAILABLE: <its message>" from the executor), or the start of a body that is not the envelope (a proxy's
// page), so that the push_delivered line names why the push failed.
func (b *PushBridge) post(ctx context.Context, doer interface {
	Do(*http.Request) (*http.Response, error)
}, body []byte) (status int, code string, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.Endpoint, bytes.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := doer.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, "", nil
	}
	raw, rerr := io.ReadAll(io.LimitReader(resp.Body, maxRefusalBytes))
	_, _ = io.Copy(io.Discard, resp.Body)
	code, err = refusal(resp.StatusCode, raw, rerr)
	return resp.StatusCode, code, err
}

// refusal describes a non-2xx answer with body raw (read with error rerr):
// its envelope's code, and an error naming the status, the code and the
// message.
func refusal(status int, raw []byte, rerr error) (string, error) {
	var env jsonhandler.Envelope
	if json.Unmarshal(raw, &env) == nil && env.Error.Code != "" {
		return env.Error.Code, fmt.Errorf("answered %d %s: %s", status, env.Error.Code, env.Error.Message)
	}
	switch msg := jsonclient.Excerpt(raw); {
	case rerr != nil:
		return "", fmt.Errorf("answered %d; reading the answer failed: %w", status, rerr)
	case msg == "":
		return "", fmt.Errorf("answered %d with no body", status)
	default:
		return "", fmt.Errorf("answered %d without the error envelope: %s", status, msg)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
