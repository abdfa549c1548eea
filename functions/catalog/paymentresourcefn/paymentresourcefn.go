// Package paymentresourcefn is the payment-resource function as a deployable (package
// functions/catalog): its functions/cmd main and the module's root package
// serve Function.
package paymentresourcefn

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/catalog"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutbus"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/serve"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
)

// Function is payment-resource.
var Function = catalog.Function{Name: "payment-resource", EnvNames: paymentresource.EnvNames, Build: buildPaymentResource, Collectors: paymentresource.Collectors}

func buildPaymentResource(ctx context.Context, getenv func(string) string, log *slog.Logger) (http.Handler, func(), error) {
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
}
