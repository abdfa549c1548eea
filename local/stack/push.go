package stack

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutbus"
)

// PushRetry is the push bridges' redelivery backoff: Terraform's
// subscription (5 s..300 s) scaled down 50 times, so that a poison message
// is dead-lettered in about 20 s.
var PushRetry = payoutbus.RetryPolicy{Min: 100 * time.Millisecond, Max: 6 * time.Second}

// CloudPushRetry is the redelivery backoff of the subscription Terraform
// creates (terraform/modules/pubsub: 5 s..300 s), unscaled.
var CloudPushRetry = payoutbus.RetryPolicy{Min: 5 * time.Second, Max: 300 * time.Second}

// pushURL is where the push bridge posts to the executor called name:
// its link with Config.Links, otherwise its URL.
func (s *Stack) pushURL(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pushURLs[name]
}

// Push runs one push bridge per executor on the stack's payout
// subscription: Pub/Sub spreads the messages over the bridges' streams, as
// a push subscription spreads them over instances. Like the subscription
// Terraform creates, a message gets at most
// payoutbus.DefaultMaxDeliveryAttempts deliveries, then goes to the
// dead-letter topic; redeliveries back off (Config.PushRetry). A push unanswered
// within Config.PushTimeout (default the cloud's ack deadline, 120 s) is a
// failed delivery, redelivered as Pub/Sub would. A restarted
// executor keeps its URL, so its bridge reaches it again. The returned
// function stops the bridges and waits for them; the bridges also end
// with ctx.
func (s *Stack) Push(ctx context.Context, log *slog.Logger) (stop func(), err error) {
	conn, err := grpc.NewClient(s.PubSubAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("stack: push bridge: %w", err)
	}
	c, err := pubsub.NewClient(ctx, PubSubProject, option.WithGRPCConn(conn))
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("stack: push bridge: %w", err)
	}
	var dead *payoutbus.Publisher
	if err := payoutbus.SetupDeadLetter(ctx, c, PubSubProject, PubSubTopic, PubSubSubscription, 0); err != nil {
		log.Error("no dead-letter policy: failed messages are redelivered without limit", "event", payoutbus.EventPushDeadLetterUnavailable, "error", err.Error())
	} else {
		dead = payoutbus.NewPublisher(c, payoutbus.DeadLetterTopic(PubSubTopic))
	}
	retry := s.cfg.PushRetry
	if retry == (payoutbus.RetryPolicy{}) {
		retry = PushRetry
	}
	bctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, e := range s.cfg.Executors {
		b := &payoutbus.PushBridge{Sub: c.Subscriber(PubSubSubscription), Admin: c.SubscriptionAdminClient, Endpoint: s.pushURL(e.Name) + "/", Log: log.With("bridge", e.Name),
			Subscription: PubSubSubscription, Retry: retry, Timeout: s.cfg.PushTimeout}
		if dead != nil {
			b.DeadLetter = dead
		}
		// Ends when bctx ends.
		wg.Go(func() {
			if err := b.Run(bctx); err != nil {
				log.Error("push bridge stopped", "executor", e.Name, "error", err)
			}
		})
	}
	return func() {
		cancel()
		wg.Wait()
		if dead != nil {
			dead.Stop()
		}
		c.Close()
		conn.Close()
	}, nil
}
