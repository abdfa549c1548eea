package gameday

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutbus"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

// bridge is the executor path of a phase whose faults execute payouts
// (Fault.Executes): the stack's push bridges (stack.Push, one per
// executor, with the dead-letter policy of the cloud's subscription),
// which run in this process, and a /metrics endpoint on a free loopback
// port that serves their counter (payout_push_dead_lettered_total) for
// Prometheus, as a deployment's Pub/Sub metrics would be.
type bridge struct {
	// logPath is the bridges' JSON log (push_delivered,
	// push_dead_lettered), the runbooks' $PUSH_LOG.
	logPath string
	// addr is the host:port of the /metrics endpoint.
	addr string

	srv      *http.Server
	stopPush func()
	logf     *os.File
}

// startBridge starts the push bridges of st and their /metrics endpoint.
// stop ends both and waits for them.
func startBridge(ctx context.Context, st *stack.Stack) (b *bridge, err error) {
	b = &bridge{logPath: filepath.Join(st.Dir(), "push-bridge.log")}
	if b.logf, err = os.Create(b.logPath); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			b.stop()
		}
	}()
	reg := prometheus.NewRegistry()
	for _, c := range payoutbus.Collectors() {
		if err := reg.Register(c); err != nil {
			return b, fmt.Errorf("push bridge metrics: %w", err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return b, err
	}
	b.addr = ln.Addr().String()
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	b.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = b.srv.Serve(ln) }() // ends at stop (Shutdown)
	if b.stopPush, err = st.Push(ctx, slog.New(slog.NewJSONHandler(b.logf, nil))); err != nil {
		return b, err
	}
	return b, nil
}

// stop ends the bridges, then the /metrics endpoint, and closes the log.
func (b *bridge) stop() {
	if b.stopPush != nil {
		b.stopPush()
	}
	if b.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := b.srv.Shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = b.srv.Close()
		}
		cancel()
	}
	if b.logf != nil {
		_ = b.logf.Close()
	}
}
