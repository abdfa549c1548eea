// Package httpserve is the HTTP server of every process of the project
// (lock-server, the payout functions through functions/serve, the local
// demo): New builds an *http.Server that bounds every phase of a
// connection and refuses non-canonical paths with the JSON error
// envelope, and Serve runs it until its context ends, then drains within
// Config.ShutdownTimeout. docs/cloud.md says why functions-framework-go's own
// server is not used.
package httpserve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
)

// Errors of this package; test them with errors.Is.
var (
	// ErrInvalidConfig is wrapped by every error of Config.Validate.
	ErrInvalidConfig = errors.New("httpserve: invalid config")
	// ErrDrainTimeout: Serve's drain did not end within ShutdownTimeout;
	// the connections still open were closed, cutting their requests.
	ErrDrainTimeout = errors.New("httpserve: in-flight requests outlived the shutdown timeout")
)

// Config bounds a server's connections. Start from DefaultConfig; every
// duration must be positive (a zero would mean "no limit" to net/http,
// which is exactly what this package exists to prevent).
type Config struct {
	// ReadHeaderTimeout bounds the reading of a request's headers, from the
	// moment the connection is accepted or the previous answer is sent.
	// Default 5 s: a client that sends its headers slower is cut
	// (slowloris).
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds the reading of a whole request, headers and body.
	// Default 10 s: every body of the project is a few KiB at most; a body
	// trickled at one byte per second is cut.
	ReadTimeout time.Duration
	// WriteTimeout bounds the time from the end of the request headers to
	// the end of the answer, so it includes the handler. It must exceed
	// the slowest handler: past it the answer is lost (the connection is
	// closed) while the handler runs on. Default 60 s: the executor's worst
	// case (a 15 s wait for the account's lock, then a claim, the rail call
	// and the result, each bounded) stays under it.
	WriteTimeout time.Duration
	// IdleTimeout bounds how long a keep-alive connection waits for its
	// next request. Default 2 min.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds the request line and headers, in bytes
	// (net/http allows 4096 bytes of slack on top); beyond it the answer is
	// 431. Default 32 KiB: a Pub/Sub push with its OIDC token is under
	// 4 KiB.
	MaxHeaderBytes int
	// ShutdownTimeout bounds Serve's drain of in-flight requests after its
	// context ends. Default 8 s: Cloud Run sends SIGKILL 10 s after
	// SIGTERM, and the process still has its dependencies to close.
	ShutdownTimeout time.Duration
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    32 << 10,
		ShutdownTimeout:   8 * time.Second,
	}
}

// Validate returns nil or one error per invalid field, joined
// (errors.Join), each wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	var errs []error
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"ReadHeaderTimeout", c.ReadHeaderTimeout}, {"ReadTimeout", c.ReadTimeout},
		{"WriteTimeout", c.WriteTimeout}, {"IdleTimeout", c.IdleTimeout},
		{"ShutdownTimeout", c.ShutdownTimeout},
	} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%w: %s %v is not positive", ErrInvalidConfig, d.name, d.v))
		}
	}
	if c.ReadHeaderTimeout > c.ReadTimeout && c.ReadTimeout > 0 {
		errs = append(errs, fmt.Errorf("%w: ReadHeaderTimeout %v exceeds ReadTimeout %v, which also covers the headers", ErrInvalidConfig, c.ReadHeaderTimeout, c.ReadTimeout))
	}
	if c.MaxHeaderBytes <= 0 {
		errs = append(errs, fmt.Errorf("%w: MaxHeaderBytes %d is not positive", ErrInvalidConfig, c.MaxHeaderBytes))
	}
	return errors.Join(errs...)
}

// New returns a server for h with cfg's limits, h behind Canonical, and
// net/http's error log written to log at WARN (event http_server_error).
// It returns an error wrapping ErrInvalidConfig if cfg is invalid, or an
// error if h or log is nil. The server is not started: see Serve.
func New(h http.Handler, cfg Config, log *slog.Logger) (*http.Server, error) {
	if h == nil || log == nil {
		return nil, errors.New("httpserve: New needs a handler and a logger")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &http.Server{
		Handler:           Canonical(h),
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		// "OPTIONS *" goes through Canonical like every other request.
		DisableGeneralOptionsHandler: true,
		ErrorLog:                     slog.NewLogLogger(log.With("event", EventServerError).Handler(), slog.LevelWarn),
	}, nil
}

// Serve builds a server for h with New and serves it on ln until ctx ends
// or the server fails. When ctx ends it stops accepting, closes idle
// connections, waits up to cfg.ShutdownTimeout for in-flight requests to be
// answered, then closes every connection left. It returns nil after a
// complete drain, an error wrapping ErrDrainTimeout when requests were cut,
// or the error that stopped the server. ln is closed when it returns.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, cfg Config, log *slog.Logger) error {
	srv, err := New(h, cfg, log)
	if err != nil {
		_ = ln.Close()
		return err
	}
	served := make(chan error, 1)
	// Ends when the server is shut down or closed below.
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("httpserve: serve on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	var drainErr error
	if err := srv.Shutdown(sctx); err != nil {
		// A client that never finishes its request holds the drain open:
		// past the timeout, cut every connection rather than hang.
		_ = srv.Close()
		drainErr = fmt.Errorf("%w (%v): %v", ErrDrainTimeout, cfg.ShutdownTimeout, err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return errors.Join(drainErr, fmt.Errorf("httpserve: serve on %s: %w", ln.Addr(), err))
	}
	return drainErr
}

// Canonical refuses, with 400 and the JSON error envelope (code
// jsonhandler.CodeInvalidRequest), a request whose path is not in canonical
// form (see CanonicalPath), and passes every other request to h.
func Canonical(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := r.URL.Path; !CanonicalPath(p) {
			jsonhandler.WriteError(w, http.StatusBadRequest, jsonhandler.CodeInvalidRequest, fmt.Sprintf("path %q is not in canonical form", p), false)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// CanonicalPath reports whether p (a request's decoded URL path) is
// absolute and unchanged by path.Clean except for one trailing slash: no
// ".", "..", or empty segment. "/", "/v1/payouts" and "/v1/payouts/" are
// canonical; "", "*", "//", "/a/../b", "/a/./b" and "/a//b" are not.
func CanonicalPath(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	c := path.Clean(p)
	return c == p || c != "/" && c+"/" == p // "//" cleans to "/"
}
