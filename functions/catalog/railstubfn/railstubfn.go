// Package railstubfn is the rail-stub function as a deployable (package
// functions/catalog): its functions/cmd main and the module's root package
// serve Function.
package railstubfn

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/catalog"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/serve"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
)

// Function is rail-stub.
var Function = catalog.Function{Name: "rail-stub", EnvNames: railstub.EnvNames, Build: buildRailStub, Collectors: railstub.Collectors}

func buildRailStub(_ context.Context, getenv func(string) string, log *slog.Logger) (http.Handler, func(), error) {
	cfg, err := railstub.LoadConfig(getenv)
	if err != nil {
		return nil, nil, err
	}
	s, err := railstub.New(cfg, log)
	if err != nil {
		return nil, nil, err
	}
	return tracing.Handler("rail-stub", s, serve.PathMetrics), func() { _ = s.Close() }, nil
}
