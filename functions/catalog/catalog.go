// Package catalog holds the five payout functions as deployables: each
// one's name, the environment variables it reads, how it builds its handler
// from them and its metrics. Each functions/cmd/<name> main serves one of
// them with serve.Main; the module's root package registers all five with
// functions-framework-go (see Handler and Function.ReceivePubSub), so both
// ways build a function from the same code and the same environment.
package catalog

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor/fault"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutbus"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/reconciler"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/serve"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/idtokens"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
)

// Function is one deployable function.
type Function struct {
	// Name is the Cloud Run service's name, the value of "service" in
	// its logs and its FUNCTION_TARGET under functions-framework-go.
	Name string
	// EnvNames lists the variables Build reads, for the unknown-variable
	// warning at start.
	EnvNames func() []string
	// Build makes the handler from the environment.
	Build serve.Builder
	// Collectors returns the function's own metrics, served beside the
	// request and runtime metrics.
	Collectors func() []prometheus.Collector
}

// The five functions.
var (
	PaymentResource = Function{Name: "payment-resource", EnvNames: paymentresource.EnvNames, Build: buildPaymentResource, Collectors: paymentresource.Collectors}
	RailProxy       = Function{Name: "rail-proxy", EnvNames: railProxyEnv, Build: buildRailProxy, Collectors: railproxy.Collectors}
	RailStub        = Function{Name: "rail-stub", EnvNames: railstub.EnvNames, Build: buildRailStub, Collectors: railstub.Collectors}
	Reconciler      = Function{Name: "reconciler", EnvNames: reconcilerEnv, Build: buildReconciler, Collectors: reconciler.Collectors}
	Executor        = Function{Name: "executor", EnvNames: executorEnv, Build: buildExecutor, Collectors: executor.Collectors}
)

// HTTPFunctions returns the functions that answer plain HTTP requests:
// every one but the executor, which Pub/Sub drives.
func HTTPFunctions() []Function {
	return []Function{PaymentResource, RailProxy, RailStub, Reconciler}
}

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
