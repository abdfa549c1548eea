// Package executorfn is the executor function as a deployable (package
// functions/catalog): its functions/cmd main and the module's root package
// serve Function.
package executorfn

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/catalog"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor/fault"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/idtokens"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
)

// Function is executor.
var Function = catalog.Function{Name: "executor", EnvNames: executorEnv, Build: buildExecutor, Collectors: executor.Collectors}

func executorEnv() []string {
	return append(append(executor.EnvNames(), fault.EnvNames()...), executor.EnvIDTokens)
}

// releaseDrain bounds the wait for the lease releases in flight at stop:
// httpserve's drain takes up to 8 s of Cloud Run's 10 s grace.
const releaseDrain = time.Second

func buildExecutor(ctx context.Context, getenv func(string) string, log *slog.Logger) (http.Handler, func(), error) {
	cfg, err := executor.LoadConfig(getenv)
	if err != nil {
		return nil, nil, err
	}
	var opts []executor.Option
	if on, err := idtokens.Enabled(executor.EnvIDTokens, getenv(executor.EnvIDTokens)); err != nil {
		return nil, nil, err
	} else if on {
		// Cloud Run: payment-resource and rail-proxy are private services.
		tr, err := idtokens.New(ctx, nil, nil, cfg.PaymentResourceURL, cfg.RailProxyURL)
		if err != nil {
			return nil, nil, err
		}
		// The span (and traceparent) outside, the ID token inside.
		opts = append(opts, executor.WithHTTPClient(&http.Client{Transport: tracing.Transport(tr)}))
	}
	// The fencing experiment and the game day arm a fault through the
	// environment; production arms none.
	f, err := fault.FromEnv(getenv, cfg.LeaseTTL, log)
	if err != nil {
		return nil, nil, err
	}
	if f != nil {
		opts = append(opts, executor.WithFault(f))
	}
	x, err := executor.New(cfg, log, opts...)
	if err != nil {
		return nil, nil, err
	}
	// After the drain: wait for the lease releases still in flight (each
	// is sent after its push was answered), within what is left of Cloud
	// Run's grace; a release cut short leaves its lease to its TTL, as a
	// crash would.
	closeFn := func() {
		cctx, cancel := context.WithTimeout(context.Background(), releaseDrain)
		defer cancel()
		if err := x.Close(cctx); err != nil {
			log.Warn("lease releases unfinished at stop; their leases end by their TTL", "event", executor.EventReleasesUnfinished, "error", err.Error())
		}
	}
	return x, closeFn, nil
}
