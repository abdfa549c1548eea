// Command payment-resource is fence point one as a process (package
// functions/paymentresource): payouts, accounts and the ledger in paydb,
// every holder's write conditional on its fencing token, and payout events
// published to Pub/Sub through a transactional outbox. Configuration is
// read from the environment (docs/configuration.md); Pub/Sub is the real
// service, or the emulator when PUBSUB_EMULATOR_HOST is set.
package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutbus"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/serve"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
)

func main() {
	serve.Main("payment-resource", envNames(), func(ctx context.Context, getenv func(string) string, log *slog.Logger) (http.Handler, func(), error) {
		cfg, err := paymentresource.LoadConfig(getenv)
		if err != nil {
			return nil, nil, err
		}
		project, topic := getenv("PUBSUB_PROJECT"), getenv("PUBSUB_TOPIC")
		if project == "" || topic == "" {
			return nil, nil, errors.New("PUBSUB_PROJECT and PUBSUB_TOPIC are required")
		}
		psc, err := pubsub.NewClient(ctx, project)
		if err != nil {
			return nil, nil, err
		}
		if sub := getenv("PUBSUB_SETUP_SUBSCRIPTION"); sub != "" {
			// Local stacks create their topic and pull subscription at start.
			if err := payoutbus.Setup(ctx, psc, project, topic, sub, 60*time.Second); err != nil {
				_ = psc.Close()
				return nil, nil, err
			}
		}
		pub := payoutbus.NewPublisher(psc, topic)
		svc, err := paymentresource.New(ctx, cfg, pub, log)
		if err != nil {
			pub.Stop()
			_ = psc.Close()
			return nil, nil, err
		}
		return tracing.Handler("payment-resource", svc.Handler(), serve.PathMetrics), func() {
			svc.Close()
			pub.Stop()
			_ = psc.Close()
		}, nil
	}, paymentresource.Collectors()...)
}

// envNames lists the environment variables payment-resource reads (its
// config's constants), for the unknown-variable warning at start. The
// PUBSUB_ variables main reads carry none of envcheck.Prefixes.
func envNames() []string { return paymentresource.EnvNames() }
