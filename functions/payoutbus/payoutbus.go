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
// acknowledged only after a 2xx answer, and redelivered otherwise.
package payoutbus

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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

// PushBridge pulls from a subscription and posts each message, wrapped as a
// Pub/Sub push request, to an HTTP endpoint.
type PushBridge struct {
	// Sub is the subscription to pull from.
	Sub *pubsub.Subscriber
	// Endpoint receives the push requests (the executor's URL).
	Endpoint string
	// Doer sends the requests; default a client with a 60 s timeout.
	Doer interface {
		Do(*http.Request) (*http.Response, error)
	}
	// Copies, when set, returns how many times to post one delivery and
	// whether the copies go at once (concurrently) or one after another. It
	// lets tests make every message arrive two or three times, some copies
	// concurrent, as at-least-once delivery may. The delivery is
	// acknowledged when every copy was answered 2xx. Default: one copy.
	Copies func(messageID string) (n int, concurrent bool)
	// Log receives one line per delivery.
	Log *slog.Logger
}

// Run delivers until ctx ends; it returns nil then, or the first error of
// the subscription.
func (b *PushBridge) Run(ctx context.Context) error {
	if b.Sub == nil || b.Endpoint == "" || b.Log == nil {
		return errors.New("payoutbus: PushBridge needs Sub, Endpoint and Log")
	}
	doer := b.Doer
	if doer == nil {
		doer = &http.Client{Timeout: 60 * time.Second}
	}
	err := b.Sub.Receive(ctx, func(ctx context.Context, m *pubsub.Message) {
		attempt := 0
		if m.DeliveryAttempt != nil {
			attempt = *m.DeliveryAttempt
		}
		body, err := pushBody(m, attempt)
		if err != nil {
			b.Log.Error("push bridge cannot wrap a message; acking it", "event", "push_bridge_unwrappable", "messageId", m.ID, "error", err.Error())
			m.Ack()
			return
		}
		n, concurrent := 1, false
		if b.Copies != nil {
			n, concurrent = b.Copies(m.ID)
		}
		ok := b.deliver(ctx, doer, m.ID, body, max(n, 1), concurrent)
		if ok {
			m.Ack()
		} else {
			m.Nack()
		}
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("payoutbus: receive: %w", err)
	}
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
		b.Log.Info("push delivered", "event", "push_delivered", "messageId", id, "copy", copy, "status", status, "error", errString(err))
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
