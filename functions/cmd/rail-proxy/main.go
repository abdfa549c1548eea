// Command rail-proxy is fence point two as a process (package
// functions/railproxy): it serves POST /v1/rail/submissions on $PORT,
// checking each holder's fencing token against the persisted per-account
// high-water mark before the rail is called. Configuration is read from the
// environment (docs/configuration.md).
package main

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/serve"
)

func main() {
	serve.Main("rail-proxy", func(ctx context.Context, getenv func(string) string, log *slog.Logger) (http.Handler, func(), error) {
		cfg, err := railproxy.LoadConfig(getenv)
		if err != nil {
			return nil, nil, err
		}
		p, err := railproxy.New(ctx, cfg, log)
		if err != nil {
			return nil, nil, err
		}
		return p, func() { _ = p.Close() }, nil
	})
}
