// Package reconcilerfn is the reconciler function as a deployable (package
// functions/catalog): its functions/cmd main and the module's root package
// serve Function.
package reconcilerfn

import (
	"context"
	"log/slog"
	"net/http"
	"sync"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/catalog"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/reconciler"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/serve"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/idtokens"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
)

// Function is reconciler.
var Function = catalog.Function{Name: "reconciler", EnvNames: reconcilerEnv, Build: buildReconciler, Collectors: reconciler.Collectors}

func reconcilerEnv() []string {
	return append(append(reconciler.EnvNames(), reconciler.EnvIDTokens), reconciler.AuditEnvNames()...)
}

// buildReconciler makes the reconciler's handler and starts its loop when
// an interval is set; close stops the loop, waits for it and closes the
// audit's pools.
func buildReconciler(ctx context.Context, getenv func(string) string, log *slog.Logger) (http.Handler, func(), error) {
	cfg, err := reconciler.LoadConfig(getenv)
	if err != nil {
		return nil, nil, err
	}
	var doer interface {
		Do(*http.Request) (*http.Response, error)
	} = &http.Client{Transport: tracing.Transport(nil)}
	if on, err := idtokens.Enabled(reconciler.EnvIDTokens, getenv(reconciler.EnvIDTokens)); err != nil {
		return nil, nil, err
	} else if on {
		// Cloud Run: payment-resource and rail-proxy are private services.
		tr, err := idtokens.New(ctx, nil, nil, cfg.PaymentResourceURL, cfg.RailProxyURL)
		if err != nil {
			return nil, nil, err
		}
		doer = &http.Client{Transport: tracing.Transport(tr)}
	}
	opts := []reconciler.Option{reconciler.WithHTTPClient(doer)}
	audit, closeAudit, err := reconciler.DBAuditor(ctx, getenv(reconciler.EnvAuditPaydbURL), getenv(reconciler.EnvAuditRaildbURL),
		getenv(reconciler.EnvAuditRailURL), cfg.AuditSettle, http.DefaultClient)
	if err != nil {
		return nil, nil, err
	}
	if audit != nil {
		opts = append(opts, reconciler.WithAuditor(audit))
	}
	r, err := reconciler.New(cfg, log, opts...)
	if err != nil {
		if closeAudit != nil {
			closeAudit()
		}
		return nil, nil, err
	}
	lctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { r.Loop(lctx) }) // returns at once without an interval
	return tracing.Handler("reconciler", r, serve.PathMetrics), func() {
		stop()
		wg.Wait()
		if closeAudit != nil {
			closeAudit()
		}
	}, nil
}
