// Package overload is what lock-server, payment-resource and rail-proxy do
// when more requests arrive than they should hold at once (a bound on
// requests in flight, ReasonOverloaded), or when their backend stops
// answering (fail fast while it is marked stalled, one probe per
// Config.StallProbeInterval, ReasonStalled). Admit each request through
// a Guard (New, Guard.Admit) and run each backend call under Guard.Call;
// a refusal is the service's own 503 with Retry-After (SetRetryAfter). A
// Guard starts no goroutine. docs/reliability.md has the reasoning.
package overload

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// RetryAfterSeconds is the Retry-After, in whole seconds, of every
// retryable 503 of the services that use this package: long enough for a
// stall probe (StallProbeInterval, 500 ms by default) to have run, short
// enough that a caller comes back soon after the backend does.
const RetryAfterSeconds = 1

// HeaderRetryAfter is the name of the HTTP header SetRetryAfter writes
// (RFC 9110, section 10.2.3; whole seconds here).
const HeaderRetryAfter = "Retry-After"

// SetRetryAfter sets Retry-After: RetryAfterSeconds on h. Call it before
// the status is written.
func SetRetryAfter(h http.Header) { h.Set(HeaderRetryAfter, strconv.Itoa(RetryAfterSeconds)) }

// Log events of a Guard: the value of the "event" attribute.
const (
	// EventStalled (ERROR): a backend call ran out its full deadline;
	// requests are refused at once until a probe gets an answer.
	EventStalled = "backend_stalled"
	// EventRecovered (INFO): the backend answered again.
	EventRecovered = "backend_recovered"
)

// Errors of this package; test them with errors.Is.
var (
	// ErrInvalidConfig is wrapped by every error of Config.Validate and
	// New.
	ErrInvalidConfig = errors.New("overload: invalid config")
	// ErrStalled is the cause (context.Cause) of a Call's context cut
	// because the backend was marked stalled while it ran
	// (Config.StallAfter).
	ErrStalled = errors.New("overload: backend marked stalled; call cut")
)

// Defaults of Config.
const (
	// DefaultMaxInFlight is DefaultConfig's MaxInFlight: far above what one
	// instance's database pool (4 to 16 connections) serves in parallel,
	// far below what exhausts its memory.
	DefaultMaxInFlight = 256
	// DefaultStallProbeInterval is DefaultConfig's StallProbeInterval.
	DefaultStallProbeInterval = 500 * time.Millisecond
	// DefaultStallAfter is the StallAfter payment-resource and rail-proxy
	// use by default (DefaultConfig leaves it 0, lock-server's setting):
	// their queries take milliseconds, so a second in which the database
	// answers no call at all is a stall, and cutting there leaves the
	// caller (the executor's 5 s request timeout) four seconds to hear the
	// 503.
	DefaultStallAfter = time.Second
	// MaxMaxInFlight bounds MaxInFlight: more is a typo.
	MaxMaxInFlight = 100_000
	// MaxStallProbeInterval bounds StallProbeInterval: a longer one keeps
	// a recovered backend refused for too long.
	MaxStallProbeInterval = time.Minute
)

// Config configures a Guard. Start from DefaultConfig: the zero value is
// not valid.
type Config struct {
	// MaxInFlight bounds the requests admitted at once; one more is
	// refused with ReasonOverloaded. Default DefaultMaxInFlight; 1 to
	// MaxMaxInFlight.
	MaxInFlight int
	// StallProbeInterval is how often, while the backend is marked
	// stalled, one request is let through to probe it; the others are
	// refused with ReasonStalled. Default DefaultStallProbeInterval;
	// positive, at most MaxStallProbeInterval.
	StallProbeInterval time.Duration
	// StallAfter, when positive, also suspects a stall when a call made
	// with Guard.Call has been running this long and no backend call has
	// answered since it started, and then asks Ping: if Ping does not
	// answer within StallAfter either, the backend is marked stalled and
	// every call still running is cut (its context cancelled with cause
	// ErrStalled), so that its request is answered at once too, long
	// before a call's full deadline. A call that is merely slow (a lock
	// wait, a long query) does not stop Ping, and goes on. Default 0: off,
	// only a call that runs out its full deadline marks the backend
	// stalled. At most MaxStallProbeInterval; requires Ping.
	StallAfter time.Duration
	// Ping asks the backend for a trivial answer on a path of its own (a
	// new connection, not one the waiting calls may hold); it must honour
	// ctx. Required with StallAfter.
	Ping func(ctx context.Context) error
	// Now is the clock of the stall probes; nil means time.Now. For tests.
	// StallAfter is measured on the real clock.
	Now func() time.Time
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{MaxInFlight: DefaultMaxInFlight, StallProbeInterval: DefaultStallProbeInterval}
}

// Validate returns nil or one error per invalid field, joined, each
// wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	var errs []error
	if c.MaxInFlight <= 0 || c.MaxInFlight > MaxMaxInFlight {
		errs = append(errs, fmt.Errorf("%w: MaxInFlight %d is outside 1..%d", ErrInvalidConfig, c.MaxInFlight, MaxMaxInFlight))
	}
	if c.StallProbeInterval <= 0 || c.StallProbeInterval > MaxStallProbeInterval {
		errs = append(errs, fmt.Errorf("%w: StallProbeInterval %v is outside (0, %v]", ErrInvalidConfig, c.StallProbeInterval, MaxStallProbeInterval))
	}
	if c.StallAfter < 0 || c.StallAfter > MaxStallProbeInterval {
		errs = append(errs, fmt.Errorf("%w: StallAfter %v is outside [0, %v]", ErrInvalidConfig, c.StallAfter, MaxStallProbeInterval))
	}
	if c.StallAfter > 0 && c.Ping == nil {
		errs = append(errs, fmt.Errorf("%w: StallAfter %v needs Ping", ErrInvalidConfig, c.StallAfter))
	}
	return errors.Join(errs...)
}

// Reason is why Admit refused a request.
type Reason string

// Reasons of a refusal. Each service maps them to its own stable code.
const (
	// ReasonOverloaded: MaxInFlight requests are in flight. Nothing was
	// done.
	ReasonOverloaded Reason = "overloaded"
	// ReasonStalled: the backend is marked stalled and it is not this
	// request's turn to probe it. Nothing was done.
	ReasonStalled Reason = "stalled"
)

// Outcome is what one backend call says about the backend.
type Outcome int

// Outcomes of a backend call, for Observe.
const (
	// Inconclusive: the call ended without telling (the caller went away,
	// or its own shorter budget ran out).
	Inconclusive Outcome = iota
	// Answered: the backend answered (a result, or a refusal of its own).
	Answered
	// TimedOut: the call ran out its full deadline (WithTimeout): the
	// backend did not answer in the time it is given.
	TimedOut
)

// Metrics names the gauges of Gauges: the caller spells its own metric
// names (they carry no labels).
type Metrics struct {
	// Stalled names the gauge that is 1 while a backend is marked
	// stalled, 0 otherwise. Required.
	Stalled string
	// StalledHelp is its help text. Required.
	StalledHelp string
	// InFlight, when not empty, names the gauge of the requests admitted
	// and not yet released.
	InFlight string
	// InFlightHelp is its help text; required with InFlight.
	InFlightHelp string
}

// Gauges is a prometheus.Collector of the Guards attached to it: the
// stalled gauge is 1 while any of them is stalled, the in-flight gauge
// the sum of their requests in flight. A process has one Guard per
// backend; a package whose metrics are collected before its service is
// built (payment-resource's Collectors) attaches each Guard it makes.
type Gauges struct {
	stalled, inFlight *prometheus.Desc // inFlight nil when not named

	mu     sync.Mutex
	guards map[*Guard]struct{}
}

// NewGauges returns the collector of m's gauges, with no Guard attached.
// It returns an error wrapping ErrInvalidConfig for a missing name.
func NewGauges(m Metrics) (*Gauges, error) {
	if m.Stalled == "" || m.StalledHelp == "" || (m.InFlight != "") != (m.InFlightHelp != "") {
		return nil, fmt.Errorf("%w: Metrics needs Stalled with its help, and InFlight with its help or neither", ErrInvalidConfig)
	}
	c := &Gauges{stalled: prometheus.NewDesc(m.Stalled, m.StalledHelp, nil, nil), guards: map[*Guard]struct{}{}}
	if m.InFlight != "" {
		c.inFlight = prometheus.NewDesc(m.InFlight, m.InFlightHelp, nil, nil)
	}
	return c, nil
}

// Attach makes g's state part of the gauges until detach is called.
func (c *Gauges) Attach(g *Guard) (detach func()) {
	c.mu.Lock()
	c.guards[g] = struct{}{}
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		delete(c.guards, g)
		c.mu.Unlock()
	}
}

// Describe implements prometheus.Collector.
func (c *Gauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.stalled
	if c.inFlight != nil {
		ch <- c.inFlight
	}
}

// Collect implements prometheus.Collector.
func (c *Gauges) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	var stalled, inFlight float64
	for g := range c.guards {
		if g.Stalled() {
			stalled = 1
		}
		inFlight += float64(g.InFlight())
	}
	c.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.stalled, prometheus.GaugeValue, stalled)
	if c.inFlight != nil {
		ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, inFlight)
	}
}

// Guard admits requests under the in-flight bound and tracks a stalled
// backend. It is safe for concurrent use.
type Guard struct {
	slots      chan struct{}
	probeEvery time.Duration
	now        func() time.Time
	log        *slog.Logger

	stallAfter time.Duration
	ping       func(context.Context) error

	mu        sync.Mutex
	stalled   bool
	probing   bool
	nextProbe time.Time
	answers   uint64             // backend calls answered so far (Observe(Answered))
	calls     map[*call]struct{} // Calls running
}

// call is one backend call made with Guard.Call.
type call struct {
	answersAtStart uint64
	cancel         context.CancelCauseFunc
	timer          *time.Timer // nil without StallAfter
}

// New returns a Guard. It returns an error wrapping ErrInvalidConfig when
// cfg is invalid or log is nil.
func New(cfg Config, log *slog.Logger) (*Guard, error) {
	if log == nil {
		return nil, fmt.Errorf("%w: nil logger", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	return &Guard{slots: make(chan struct{}, cfg.MaxInFlight), probeEvery: cfg.StallProbeInterval, now: now, log: log,
		stallAfter: cfg.StallAfter, ping: cfg.Ping, calls: map[*call]struct{}{}}, nil
}

// Register registers with reg the gauges m names, of g alone (Gauges).
// Call it once, before serving. It returns reg's error (a name already
// registered) or one wrapping ErrInvalidConfig for a missing name.
func (g *Guard) Register(reg prometheus.Registerer, m Metrics) error {
	c, err := NewGauges(m)
	if err != nil {
		return err
	}
	c.Attach(g)
	return reg.Register(c)
}

// Admit takes a slot for one request. It returns release (call it once,
// when the request is done) and ok, or the reason to refuse the request at
// once: ReasonOverloaded when every slot is taken, ReasonStalled while the
// backend is stalled and it is not this request's turn to probe.
func (g *Guard) Admit() (release func(), reason Reason, ok bool) {
	select {
	case g.slots <- struct{}{}:
	default:
		return nil, ReasonOverloaded, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stalled && (g.probing || g.now().Before(g.nextProbe)) {
		<-g.slots
		return nil, ReasonStalled, false
	}
	probe := g.stalled
	if probe {
		g.probing = true // this request's backend calls decide
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			if probe {
				g.mu.Lock()
				g.probing = false
				g.mu.Unlock()
			}
			<-g.slots
		})
	}, "", true
}

// InFlight returns the number of requests admitted and not yet released.
func (g *Guard) InFlight() int { return len(g.slots) }

// Stalled reports whether the backend is marked stalled.
func (g *Guard) Stalled() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stalled
}

// Observe records the outcome of one backend call. A TimedOut call marks
// the backend stalled (and puts the next probe one StallProbeInterval
// away); an Answered one clears the mark.
func (g *Guard) Observe(o Outcome, cause error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch o {
	case TimedOut:
		g.markLocked(cause)
	case Answered:
		g.answers++
		if g.stalled {
			g.stalled = false
			g.log.Info("backend answered again", "event", EventRecovered)
		}
	}
}

// markLocked marks the backend stalled (or, already stalled, puts the
// next probe one interval away). g.mu is held.
func (g *Guard) markLocked(cause error) {
	g.nextProbe = g.now().Add(g.probeEvery)
	if g.stalled {
		return
	}
	g.stalled = true
	msg := ""
	if cause != nil {
		msg = cause.Error()
	}
	g.log.Error("backend stalled: answering 503 at once until a probe succeeds", "event", EventStalled,
		"error", msg, "probeEveryMs", g.probeEvery.Milliseconds())
}

// Call starts one backend call: its context is WithTimeout(parent, d),
// and done records its outcome (Classify with the caller's unavailable
// sentinel, then Observe) and must be called once when the call returns.
// With Config.StallAfter, a call still running after StallAfter while no
// backend call has answered since it started makes the Guard ask
// Config.Ping; if that gets no answer either, the backend is marked
// stalled and every running Call is cut (context cause ErrStalled); the
// caller answers its request as it answers a backend that did not answer.
func (g *Guard) Call(parent context.Context, d time.Duration, unavailable error) (ctx context.Context, done func(error)) {
	ctx, cancelTimeout := WithTimeout(parent, d)
	ctx, cancel := context.WithCancelCause(ctx)
	g.mu.Lock()
	c := &call{answersAtStart: g.answers, cancel: cancel}
	g.calls[c] = struct{}{}
	if g.stallAfter > 0 {
		c.timer = time.AfterFunc(g.stallAfter, func() { g.watch(c) })
	}
	g.mu.Unlock()
	var once sync.Once
	return ctx, func(err error) {
		once.Do(func() {
			g.mu.Lock()
			delete(g.calls, c)
			if c.timer != nil {
				c.timer.Stop()
			}
			g.mu.Unlock()
			g.Observe(Classify(ctx, err, unavailable), err)
			cancel(nil)
			cancelTimeout()
		})
	}
}

// watch runs StallAfter after call c started (or was last re-armed): if c
// still runs and no backend call has answered since, it asks Ping; an
// answer counts as one and re-arms c's watch, no answer within StallAfter
// marks the backend stalled and cuts every running call.
func (g *Guard) watch(c *call) {
	g.mu.Lock()
	_, running := g.calls[c]
	quiet := running && g.answers == c.answersAtStart
	stalled := g.stalled
	g.mu.Unlock()
	if !quiet {
		return
	}
	var perr error = ErrStalled // already marked: no need to ask again
	if !stalled {
		ctx, cancel := context.WithTimeout(context.Background(), g.stallAfter)
		perr = g.ping(ctx)
		cancel()
	}
	g.mu.Lock()
	if perr == nil {
		g.answers++ // the backend answers: c is slow, not stalled
		if _, running := g.calls[c]; running {
			c.answersAtStart = g.answers
			c.timer = time.AfterFunc(g.stallAfter, func() { g.watch(c) })
		}
		g.mu.Unlock()
		return
	}
	g.markLocked(fmt.Errorf("no backend call answered for %v, nor a ping: %w", g.stallAfter, perr))
	cut := make([]context.CancelCauseFunc, 0, len(g.calls))
	for other := range g.calls {
		cut = append(cut, other.cancel)
	}
	g.mu.Unlock()
	for _, cancel := range cut {
		cancel(ErrStalled)
	}
}

// fullDeadline marks a backend context whose deadline is the whole time
// the backend is given (not shortened by a caller's budget): running it
// out means the backend, not the caller, was slow.
type fullDeadline struct{}

// WithTimeout is context.WithTimeout(parent, d) for one backend call,
// marked as having the backend's full deadline unless parent already ends
// sooner. Classify calls a timeout of such a context TimedOut.
func WithTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if dl, ok := parent.Deadline(); !ok || !dl.Before(time.Now().Add(d)) {
		parent = MarkFull(parent)
	}
	return context.WithTimeout(parent, d)
}

// MarkFull marks ctx as carrying the backend's full deadline (see
// WithTimeout), for a caller that computes its deadline itself.
func MarkFull(ctx context.Context) context.Context {
	return context.WithValue(ctx, fullDeadline{}, true)
}

// Classify tells what a backend call made with ctx, which returned err,
// says about the backend. unavailable is the caller's sentinel for "the
// backend did not answer" (a timeout, a lost connection), which its
// errors wrap. TimedOut: err is unavailable or a deadline, ctx's deadline
// passed, and ctx had the full deadline (WithTimeout, MarkFull). Answered:
// err is nil or any error that is not unavailable, a deadline or a
// cancellation. Inconclusive otherwise.
func Classify(ctx context.Context, err error, unavailable error) Outcome {
	if err == nil {
		return Answered
	}
	noAnswer := errors.Is(err, unavailable) || errors.Is(err, context.DeadlineExceeded)
	switch {
	case noAnswer && errors.Is(ctx.Err(), context.DeadlineExceeded) && ctx.Value(fullDeadline{}) != nil:
		return TimedOut
	case !noAnswer && !errors.Is(err, context.Canceled):
		return Answered
	}
	return Inconclusive
}

// Env names one service's three overload variables (each service keeps
// its own prefix, e.g. PAYMENT_MAX_IN_FLIGHT).
type Env struct {
	// MaxInFlight: an integer, 1..MaxMaxInFlight.
	MaxInFlight string
	// StallProbeMs: milliseconds, 1..MaxStallProbeInterval.
	StallProbeMs string
	// StallAfterMs: milliseconds, 0 (off)..MaxStallProbeInterval.
	StallAfterMs string
}

// Load reads the variables of e that are set (getenv, surrounding space
// ignored) into maxInFlight, probe and after, leaving a field alone when
// its variable is unset or bad. It returns one error per bad value, each
// naming the variable, the value and the range; the caller wraps them in
// its own configuration sentinel.
func (e Env) Load(getenv func(string) string, maxInFlight *int, probe, after *time.Duration) []error {
	var errs []error
	if v := strings.TrimSpace(getenv(e.MaxInFlight)); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxMaxInFlight {
			errs = append(errs, fmt.Errorf("%s=%q: want an integer, 1..%d", e.MaxInFlight, v, MaxMaxInFlight))
		} else {
			*maxInFlight = n
		}
	}
	for _, d := range []struct {
		name string
		min  int64
		dst  *time.Duration
	}{{e.StallProbeMs, 1, probe}, {e.StallAfterMs, 0, after}} {
		v := strings.TrimSpace(getenv(d.name))
		if v == "" {
			continue
		}
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < d.min || ms > MaxStallProbeInterval.Milliseconds() {
			errs = append(errs, fmt.Errorf("%s=%q: want milliseconds, %d..%d", d.name, v, d.min, MaxStallProbeInterval.Milliseconds()))
			continue
		}
		*d.dst = time.Duration(ms) * time.Millisecond
	}
	return errs
}
