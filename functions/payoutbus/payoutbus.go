// Package payoutbus carries payout events over Pub/Sub
// (cloud.google.com/go/pubsub/v2): a Publisher that payment-resource's
// outbox drains into, topic and subscription setup with message ordering
// by account, and a PushBridge that delivers pulled messages to the
// executor's HTTP endpoint exactly as a push subscription would post them.
//
// The bridge exists because the in-process fake (pstest) has no push
// delivery. It also keeps what a raw push to a CloudEvent function would
// lose: the ordering key and the delivery attempt travel in the wrapped
// push body. Delivery is at least once, like Pub/Sub's: a message is
// acknowledged only after a 2xx answer, and redelivered otherwise, after
// the subscription's retry backoff (RetryPolicy), until its maximum
// number of delivery attempts; then it is moved to the dead-letter topic,
// logged and counted, as the subscription Terraform creates does
// (terraform/modules/pubsub: max_delivery_attempts, retry_policy), so
// that a poison message ends the same way locally as on Cloud Run.
package payoutbus

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
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

// PushBridge pulls from a subscription and posts each message, wrapped as a
// Pub/Sub push request, to an HTTP endpoint.
type PushBridge struct {
	// Sub is the subscription to pull from.
	Sub *pubsub.Subscriber
	// Endpoint receives the push requests (the executor's URL).
	Endpoint string
	// Doer sends the requests; default an http.Client with Timeout.
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

	mu       sync.Mutex
	attempts map[string]int // by message id, when the subscription does not number them
}

// Run delivers until ctx ends; it returns nil then, or the first error of
// the subscription.
func (b *PushBridge) Run(ctx context.Context) error {
	if b.Sub == nil || b.Endpoint == "" || b.Log == nil {
		return errors.New("payoutbus: PushBridge needs Sub, Endpoint and Log")
	}
	doer := b.Doer
	if doer == nil {
		timeout := b.Timeout
		if timeout <= 0 {
			timeout = DefaultPushTimeout
		}
		doer = &http.Client{Timeout: timeout}
	}
	err := b.Sub.Receive(ctx, func(ctx context.Context, m *pubsub.Message) {
		attempt := b.attempt(m)
		body, err := pushBody(m, attempt)
		if err != nil {
			b.Log.Error("push bridge cannot wrap a message; acking it", "event", EventPushBridgeUnwrappable, "messageId", m.ID, "error", err.Error())
			m.Ack()
			return
		}
		n, concurrent := 1, false
		if b.Copies != nil {
			n, concurrent = b.Copies(m.ID)
		}
		ok := b.deliver(ctx, doer, m.ID, body, max(n, 1), concurrent)
		switch {
		case ok:
			b.forget(m.ID)
			m.Ack()
		case b.DeadLetter != nil && attempt >= b.maxAttempts():
			if err := b.deadLetter(ctx, m, attempt); err != nil {
				b.Log.Error("push bridge cannot dead-letter a message; it will be redelivered", "event", EventPushDeadLetterFailed,
					"messageId", m.ID, "deliveryAttempt", attempt, "error", err.Error())
				m.Nack()
				return
			}
			b.forget(m.ID)
			m.Ack()
		default:
			t := time.NewTimer(b.Retry.Delay(attempt))
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
			m.Nack()
		}
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("payoutbus: receive: %w", err)
	}
	return nil
}

// attempt is m's delivery attempt: its DeliveryAttempt when the
// subscription numbers them, or this bridge's own count.
func (b *PushBridge) attempt(m *pubsub.Message) int {
	if m.DeliveryAttempt != nil {
		return *m.DeliveryAttempt
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.attempts == nil {
		b.attempts = map[string]int{}
	}
	b.attempts[m.ID]++
	return b.attempts[m.ID]
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
func (b *PushBridge) deadLetter(ctx context.Context, m *pubsub.Message, attempt int) error {
	attrs := make(map[string]string, len(m.Attributes)+2)
	for k, v := range m.Attributes {
		attrs[k] = v
	}
	attrs[AttrDeadLetterDeliveryCount] = strconv.Itoa(attempt)
	attrs[AttrDeadLetterSubscription] = b.Subscription
	if err := b.DeadLetter.Publish(ctx, m.OrderingKey, m.Data, attrs); err != nil {
		return err
	}
	deadLettered.Inc()
	b.Log.Error("message moved to the dead-letter topic after its last delivery attempt failed", "event", EventPushDeadLettered,
		"messageId", m.ID, "orderingKey", m.OrderingKey, "deliveryAttempt", attempt,
		"payoutId", m.Attributes[payoutevent.AttrPayoutID], "accountId", m.Attributes[payoutevent.AttrAccountID])
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
		status, err := b.post(ctx, doer, body)
		b.Log.Info("push delivered", "event", EventPushDelivered, "messageId", id, "copy", copy, "status", status, "error", errString(err))
		mu.Lock()
		defer mu.Unlock()
		if err != nil || status/100 != 2 {
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

func (b *PushBridge) post(ctx context.Context, doer interface {
	Do(*http.Request) (*http.Response, error)
}, body []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.Endpoint, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := doer.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// pushBody wraps m as the JSON body of a Pub/Sub push request.
func pushBody(m *pubsub.Message, attempt int) ([]byte, error) {
	return payoutevent.EncodeRaw(m.Data, m.Attributes, m.ID, m.OrderingKey, attempt)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
