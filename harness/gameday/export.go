package gameday

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/common/model"

	"github.com/distributed-lock-lab/distributed-lock-lab/harness/drive"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

// The game day's machinery, for other runs of the stack under a real
// Prometheus (harness/month).

// Monitor is a running Prometheus, scraping its targets and evaluating a
// rules file, with an Alertmanager behind it.
type Monitor struct{ m *monitor }

// StartMonitor starts Prometheus and Alertmanager with their
// configuration, data and logs in dir, the rules file rules and the
// scrape targets; Stop stops both.
func StartMonitor(ctx context.Context, dir, rules string, targets []Target) (*Monitor, error) {
	m, err := startMonitor(ctx, dir, rules, targets)
	if err != nil {
		return nil, err
	}
	return &Monitor{m: m}, nil
}

// Query evaluates the instant PromQL query expr at time at (now when at
// is zero) and returns its samples.
func (m *Monitor) Query(ctx context.Context, expr string, at time.Time) (model.Vector, error) {
	return m.m.query(ctx, expr, at)
}

// AwaitQuery polls the instant query q until it returns a series or ctx
// ends.
func (m *Monitor) AwaitQuery(ctx context.Context, q string) error { return m.m.awaitQuery(ctx, q) }

// Stop stops Prometheus and Alertmanager.
func (m *Monitor) Stop() { m.m.stop() }

// StartBridge starts the push bridges of st from Pub/Sub to its
// executors, with the /metrics endpoint of their counters at addr (a
// scrape target, job push-bridge). stop ends them and waits.
func StartBridge(ctx context.Context, st *stack.Stack) (addr string, stop func(), err error) {
	b, err := startBridge(ctx, st)
	if err != nil {
		return "", nil, err
	}
	return b.addr, b.stop, nil
}

// StartLoad starts the game day's steady load on d's stack: acquires of
// one key and readiness probes at lock-server, reads of one payout and a
// new payout every second at payment-resource, high-water reads at
// rail-proxy. stop ends it and waits.
func StartLoad(ctx context.Context, d *drive.Driver) (stop func(), err error) {
	if err := payoutLoadSetup(ctx, d); err != nil {
		return nil, err
	}
	lctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { load(lctx, d.Stack().LockServerURL()) }) // ends with lctx
	wg.Go(func() { payoutLoad(lctx, d) })                   // ends with lctx
	return func() { cancel(); wg.Wait() }, nil
}
