// Package pprofserve serves Go's profiler (net/http/pprof) from a service
// process on a loopback listener of its own, only when PPROF_ADDR
// (EnvAddr) asks for it: every service calls Start at start-up, which
// does nothing when the variable is unset and refuses a host that is not
// loopback (a profile must never be reachable from outside the machine).
package pprofserve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpserve"
)

// EnvAddr is the environment variable of the profiler's listen address,
// host:port with a loopback host. Unset or empty (the default): no
// profiler.
const EnvAddr = "PPROF_ADDR"

// EventServing (INFO) is logged once when the profiler listens, with its
// address ("addr"). It is absent when EnvAddr is unset, so the start-up
// logs of a default process are unchanged.
const EventServing = "pprof_serving"

// EventFailed (WARN) is logged when the profiler's server stops on an
// error; the process itself goes on.
const EventFailed = "pprof_failed"

// MaxProfileSeconds is the longest CPU profile or trace the profiler's
// server lets a request ask for: its write timeout is this plus 10 s.
const MaxProfileSeconds = 120

// ErrInvalidConfig is wrapped by every error of Config.Validate and
// LoadConfig.
var ErrInvalidConfig = errors.New("pprofserve: invalid config")

// Config says where the profiler listens.
type Config struct {
	// Addr is the listen address (EnvAddr): host:port, the host one of
	// 127.0.0.1, ::1 or localhost, the port 1..65535 (0 is allowed: the
	// operating system picks one, logged with EventServing). Default "":
	// off.
	Addr string
}

// DefaultConfig returns the defaults documented on Config: off.
func DefaultConfig() Config { return Config{} }

// LoadConfig returns DefaultConfig overridden by EnvAddr, validated.
func LoadConfig(getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	c.Addr = getenv(EnvAddr)
	return c, c.Validate()
}

// Enabled reports whether the profiler is to be served.
func (c Config) Enabled() bool { return c.Addr != "" }

// Validate returns nil for an empty Addr or a loopback host:port, or an
// error wrapping ErrInvalidConfig that names EnvAddr.
func (c Config) Validate() error {
	if c.Addr == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(c.Addr)
	if err != nil {
		return fmt.Errorf("%w: %s=%q: want host:port: %v", ErrInvalidConfig, EnvAddr, c.Addr, err)
	}
	var errs []error
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		errs = append(errs, fmt.Errorf("%w: %s=%q: the port must be a number 0..65535", ErrInvalidConfig, EnvAddr, c.Addr))
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		errs = append(errs, fmt.Errorf("%w: %s=%q: the host must be loopback (127.0.0.1, ::1 or localhost): the profiler has no authentication", ErrInvalidConfig, EnvAddr, c.Addr))
	}
	return errors.Join(errs...)
}

// Handler returns the profiler's routes under /debug/pprof/.
func Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// Start serves the profiler on cfg.Addr until ctx ends, when cfg is
// enabled; it returns the bound address ("" when off) and a function that
// waits for the server to end (call it after ctx ended). publicAddr is the
// process's own API listener: an Addr equal to it is refused (wrapping
// ErrInvalidConfig), as is an invalid cfg; a failed listen is returned.
func Start(ctx context.Context, cfg Config, publicAddr net.Addr, log *slog.Logger) (addr string, wait func(), err error) {
	noop := func() {}
	if err := cfg.Validate(); err != nil {
		return "", noop, err
	}
	if !cfg.Enabled() {
		return "", noop, nil
	}
	if publicAddr != nil && publicAddr.String() == cfg.Addr {
		return "", noop, fmt.Errorf("%w: %s=%q is the public listener's address: the profiler needs a port of its own", ErrInvalidConfig, EnvAddr, cfg.Addr)
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return "", noop, fmt.Errorf("pprofserve: listen on %s=%s: %w", EnvAddr, cfg.Addr, err)
	}
	hcfg := httpserve.DefaultConfig()
	hcfg.WriteTimeout = (MaxProfileSeconds + 10) * time.Second
	hcfg.ShutdownTimeout = time.Second // a profile in flight is cut, not waited for
	done := make(chan struct{})
	// Ends when ctx ends (Serve drains for at most a second).
	go func() {
		defer close(done)
		if err := httpserve.Serve(ctx, ln, Handler(), hcfg, log); err != nil && !errors.Is(err, httpserve.ErrDrainTimeout) {
			log.Warn("profiler stopped", "event", EventFailed, "error", err.Error())
		}
	}()
	log.Info("profiler serving", "event", EventServing, "addr", ln.Addr().String())
	return ln.Addr().String(), func() { <-done }, nil
}
