// Package railproxyfn is the rail-proxy function as a deployable (package
// functions/catalog): its functions/cmd main and the module's root package
// serve Function.
package railproxyfn

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/catalog"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/serve"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/idtokens"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
)

// Function is rail-proxy.
var Function = catalog.Function{Name: "rail-proxy", EnvNames: railProxyEnv, Build: buildRailProxy, Collectors: railproxy.Collectors}

func railProxyEnv() []string { return append(railproxy.EnvNames(), railapi.EnvRailIDTokens) }

func buildRailProxy(ctx context.Context, getenv func(string) string, log *slog.Logger) (http.Handler, func(), error) {
	cfg, err := railproxy.LoadConfig(getenv)
	if err != nil {
		return nil, nil, err
	}
	if on, err := idtokens.Enabled(railapi.EnvRailIDTokens, getenv(railapi.EnvRailIDTokens)); err != nil {
		return nil, nil, err
	} else if on {
		tr, err := idtokens.New(ctx, nil, nil, cfg.RailURL)
		if err != nil {
			return nil, nil, err
		}
		cfg.WrapRailTransport = func(base http.RoundTripper) http.RoundTripper { tr.Base = base; return tr }
	}
	p, err := railproxy.New(ctx, cfg, log)
	if err != nil {
		return nil, nil, err
	}
	return tracing.Handler("rail-proxy", p, serve.PathMetrics), func() { _ = p.Close() }, nil
}
