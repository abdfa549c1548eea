// Command rail-stub is the deliberately non-idempotent payment rail as a
// process (package functions/railstub): every POST /submit is a new movement
// of money. Configuration is read from the environment
// (docs/configuration.md).
package main

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/serve"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
)

func main() {
	serve.Main("rail-stub", envNames(), func(_ context.Context, getenv func(string) string, log *slog.Logger) (http.Handler, func(), error) {
		cfg, err := railstub.LoadConfig(getenv)
		if err != nil {
			return nil, nil, err
		}
		s, err := railstub.New(cfg, log)
		if err != nil {
			return nil, nil, err
		}
		return tracing.Handler("rail-stub", s, serve.PathMetrics), func() { _ = s.Close() }, nil
	}, railstub.Collectors()...)
}

// envNames lists the environment variables rail-stub reads (its config's
// constants), for the unknown-variable warning at start.
func envNames() []string { return railstub.EnvNames() }
