// Package tracing sets up OpenTelemetry traces for a process of the
// project and names the span attributes every service uses. Every main
// calls Setup once; Handler and Transport put a span around each request a
// server answers or a client sends, and Inject and Extract carry the trace
// context in a Pub/Sub message's attributes. Nothing is exported unless
// the standard OTEL_* variables ask for it (Config); docs/tracing.md
// describes the setup, including Cloud Trace on Google Cloud.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"golang.org/x/oauth2/google"
)

// Span attributes of the project. Values of payout and account ids, lock
// keys and tokens are allowed here: a span describes one request.
const (
	// AttrToken is a fencing token (int64): the one a holder presents at a
	// fence point, or the one a lock store granted or was asked about.
	AttrToken = "fencing.token"
	// AttrHighestToken is the highest token a fence point had accepted
	// when it refused a write (int64).
	AttrHighestToken = "fencing.highest_token"
	// AttrFencePoint names the fence point: "payment-resource" or
	// "rail-proxy".
	AttrFencePoint = "fencing.point"
	// AttrFenceStep names the fenced write: claim, result, attention,
	// resolution (payment-resource), submission (rail-proxy).
	AttrFenceStep = "fencing.step"
	// AttrFenceResource is what refused a write: account, payout or rail.
	AttrFenceResource = "fencing.resource"
	// AttrFenceOutcome is the fence point's verdict: accepted, refused
	// (a stale token), unverified (no proof of the grant) or error (the
	// write failed for another reason; see the span's status).
	AttrFenceOutcome = "fencing.outcome"
	// AttrFencingEnabled is false when the fence point's kill switch is
	// off (the write is not fenced).
	AttrFencingEnabled = "fencing.enabled"
	// AttrLockKey is a lock key, payout:{account_id}.
	AttrLockKey = "lock.key"
	// AttrLockOwner is the owner id of a lease.
	AttrLockOwner = "lock.owner"
	// AttrLockStore names the lock-server backend (lockserver.NewServer
	// gives its Go type: *pgstore.Store, *etcdstore.Store, *memstore.Store).
	AttrLockStore = "lock.store"
	// AttrLockOutcome is a lock store's answer: ok, or the sentinel that
	// refused (held, not_held, stale_token, invalid, unavailable, restored,
	// error).
	AttrLockOutcome = "lock.outcome"
	// AttrLeaseTTLMs is the TTL asked for or granted, in milliseconds.
	AttrLeaseTTLMs = "lock.ttl_ms"
	// AttrPayoutID is a payout id.
	AttrPayoutID = "payout.id"
	// AttrAccountID is an account id.
	AttrAccountID = "payout.account_id"
	// AttrOutcome is the executor's outcome of one delivery (an
	// executor.Outcome, or the code of the error that makes Pub/Sub
	// deliver again).
	AttrOutcome = "payout.outcome"
)

// Fence outcomes, values of AttrFenceOutcome.
const (
	FenceAccepted   = "accepted"
	FenceRefused    = "refused"
	FenceUnverified = "unverified"
	FenceError      = "error"
)

// The standard OpenTelemetry variables Setup reads itself (the exporter
// and the SDK read the others).
const (
	// EnvSDKDisabled: "true" turns every signal off (no exporter).
	EnvSDKDisabled = "OTEL_SDK_DISABLED"
	// EnvTracesExporter: "otlp" or "none" (comma-separated lists are not
	// supported: one exporter at most).
	EnvTracesExporter = "OTEL_TRACES_EXPORTER"
	// EnvEndpoint is the OTLP base URL; traces go to its /v1/traces.
	EnvEndpoint = "OTEL_EXPORTER_OTLP_ENDPOINT"
	// EnvTracesEndpoint is the full URL of the OTLP traces endpoint.
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	// EnvProtocol and EnvTracesProtocol must be http/protobuf when set:
	// only OTLP over HTTP is built in.
	EnvProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	// EnvServiceName overrides the service name a main passes to Setup.
	EnvServiceName = "OTEL_SERVICE_NAME"
	// EnvResourceAttributes adds resource attributes (key=value,...);
	// LoadConfig reads gcp.project_id from it.
	EnvResourceAttributes = "OTEL_RESOURCE_ATTRIBUTES"
	// EnvGoogleProject is the Google Cloud project (not an OpenTelemetry
	// variable): the project spans sent to GoogleTelemetryHost are
	// written to, unless OTEL_RESOURCE_ATTRIBUTES names one.
	EnvGoogleProject = "GOOGLE_CLOUD_PROJECT"
)

// Google Cloud's own OTLP endpoint, the Telemetry API. Cloud Trace takes
// spans there from any OTLP exporter that signs its requests; nothing
// needs a collector in between.
const (
	// GoogleTelemetryHost is the Telemetry API's host. An OTLP endpoint
	// on it (https://telemetry.googleapis.com, or its /v1/traces) turns
	// Config.GoogleAuth on.
	GoogleTelemetryHost = "telemetry.googleapis.com"
	// AttrGCPProjectID is the resource attribute naming the project the
	// Telemetry API writes the spans to; it refuses spans without it.
	AttrGCPProjectID = "gcp.project_id"
	// googleScope is the OAuth scope of the signed requests (the
	// account's roles, roles/telemetry.tracesWriter here, decide what it
	// may do).
	googleScope = "https://www.googleapis.com/auth/cloud-platform"
)

// EventConfigured (INFO) is the log event Setup writes once, naming the
// exporter (and, for OTLP, the endpoint).
const EventConfigured = "tracing_configured"

// EventFlushFailed (WARN) is the log event a process writes at stop when
// its last spans could not be sent in time.
const EventFlushFailed = "tracing_flush_failed"

// Exporters, values of Config.Exporter.
const (
	ExporterNone = "none"
	ExporterOTLP = "otlp"
)

// protocolHTTP is the only OTLP protocol built in.
const protocolHTTP = "http/protobuf"

// ErrInvalidConfig is wrapped by every error of LoadConfig and
// Config.Validate.
var ErrInvalidConfig = errors.New("tracing: invalid config")

// Config says whether and where a process exports its spans. Start from
// DefaultConfig (export nothing) or LoadConfig (the environment).
type Config struct {
	// Exporter is ExporterNone (default: spans are not recorded, the
	// trace context is still propagated) or ExporterOTLP.
	Exporter string
	// Endpoint is where OTLP goes, for the start-up log line only: the
	// exporter reads its endpoint from the environment itself (default
	// http://localhost:4318/v1/traces).
	Endpoint string
	// GoogleAuth signs every export with Google Application Default
	// Credentials (on Cloud Run and GKE with Workload Identity: the
	// service's own account), as GoogleTelemetryHost requires. LoadConfig
	// sets it for an endpoint on that host.
	GoogleAuth bool
	// GoogleProject is the project the spans are written to, added to
	// the resource as AttrGCPProjectID; required with GoogleAuth.
	GoogleProject string
}

// DefaultConfig exports nothing.
func DefaultConfig() Config { return Config{Exporter: ExporterNone} }

// Validate returns nil or every problem, joined, each wrapping
// ErrInvalidConfig.
func (c Config) Validate() error {
	var errs []error
	if c.Exporter != ExporterNone && c.Exporter != ExporterOTLP {
		errs = append(errs, fmt.Errorf("%w: exporter %q: want %s or %s", ErrInvalidConfig, c.Exporter, ExporterOTLP, ExporterNone))
	}
	if c.GoogleAuth && c.GoogleProject == "" {
		errs = append(errs, fmt.Errorf("%w: spans sent to %s need their project: set %s, or %s=%s=PROJECT",
			ErrInvalidConfig, GoogleTelemetryHost, EnvGoogleProject, EnvResourceAttributes, AttrGCPProjectID))
	}
	return errors.Join(errs...)
}

// LoadConfig reads the standard variables through getenv:
//
//   - OTEL_SDK_DISABLED=true: no exporter, whatever else is set;
//   - OTEL_TRACES_EXPORTER=none or otlp decides; any other value is an
//     error (console, zipkin and lists are not built in);
//   - unset, OTLP is on when OTEL_EXPORTER_OTLP_ENDPOINT or
//     OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, and off otherwise (the
//     specification's default is otlp to localhost; here an unconfigured
//     process exports nothing rather than retrying a collector that is
//     not there);
//   - with OTLP on, OTEL_EXPORTER_OTLP_PROTOCOL and its _TRACES_ form must
//     be unset or http/protobuf;
//   - an endpoint on GoogleTelemetryHost turns GoogleAuth on, with the
//     project from gcp.project_id in OTEL_RESOURCE_ATTRIBUTES or else
//     GOOGLE_CLOUD_PROJECT (one of them is required).
//
// It returns every problem, joined, each wrapping ErrInvalidConfig.
func LoadConfig(getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	if strings.EqualFold(strings.TrimSpace(getenv(EnvSDKDisabled)), "true") {
		return c, nil
	}
	endpoint := cmpOr(strings.TrimSpace(getenv(EnvTracesEndpoint)), strings.TrimSpace(getenv(EnvEndpoint)))
	switch v := strings.ToLower(strings.TrimSpace(getenv(EnvTracesExporter))); v {
	case "":
		if endpoint != "" {
			c.Exporter = ExporterOTLP
		}
	case ExporterNone, ExporterOTLP:
		c.Exporter = v
	default:
		return c, fmt.Errorf("%w: %s=%q: want %s or %s (only OTLP over HTTP is built in)", ErrInvalidConfig, EnvTracesExporter, v, ExporterOTLP, ExporterNone)
	}
	if c.Exporter != ExporterOTLP {
		return c, nil
	}
	c.Endpoint = endpoint
	var errs []error
	for _, name := range []string{EnvProtocol, EnvTracesProtocol} {
		if v := strings.TrimSpace(getenv(name)); v != "" && v != protocolHTTP {
			errs = append(errs, fmt.Errorf("%w: %s=%q: only %s is built in", ErrInvalidConfig, name, v, protocolHTTP))
		}
	}
	if u, err := url.Parse(endpoint); endpoint != "" && err == nil && strings.EqualFold(u.Hostname(), GoogleTelemetryHost) {
		c.GoogleAuth = true
		c.GoogleProject = strings.TrimSpace(getenv(EnvGoogleProject))
		for kv := range strings.SplitSeq(getenv(EnvResourceAttributes), ",") {
			if k, v, ok := strings.Cut(kv, "="); ok && strings.TrimSpace(k) == AttrGCPProjectID && strings.TrimSpace(v) != "" {
				c.GoogleProject = strings.TrimSpace(v)
			}
		}
		if err := c.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return c, errors.Join(errs...)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Setup installs the global propagator (W3C trace context and baggage)
// and, when cfg asks for OTLP, a global tracer provider that batches spans
// to the OTLP/HTTP exporter, with a resource named service (unless
// OTEL_SERVICE_NAME says otherwise). It logs one line saying which
// (event tracing_configured). The returned shutdown flushes and stops the
// provider (bounded by its ctx); call it once when the process stops. It
// returns an error wrapping ErrInvalidConfig for an invalid cfg, or the
// exporter's or resource's error.
func Setup(ctx context.Context, service string, cfg Config, log *slog.Logger) (shutdown func(context.Context) error, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	otel.SetTextMapPropagator(Propagator())
	if cfg.Exporter == ExporterNone {
		log.Info("traces not exported; trace context is propagated", "event", EventConfigured, "exporter", ExporterNone)
		return func(context.Context) error { return nil }, nil
	}
	var opts []otlptracehttp.Option
	attrs := []attribute.KeyValue{semconv.ServiceName(service)}
	if cfg.GoogleAuth {
		// The client outlives Setup's ctx: it fetches and refreshes the
		// tokens for as long as the process exports.
		hc, err := google.DefaultClient(context.WithoutCancel(ctx), googleScope)
		if err != nil {
			return nil, fmt.Errorf("tracing: Application Default Credentials for %s: %w", GoogleTelemetryHost, err)
		}
		opts = append(opts, otlptracehttp.WithHTTPClient(hc))
		attrs = append(attrs, attribute.String(AttrGCPProjectID, cfg.GoogleProject))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attrs...),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES win
		resource.WithTelemetrySDK())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	log.Info("traces exported with OTLP over HTTP", "event", EventConfigured, "exporter", ExporterOTLP, "endpoint", cfg.Endpoint,
		"googleAuth", cfg.GoogleAuth)
	return tp.Shutdown, nil
}

// Propagator is the project's propagator: W3C trace context (traceparent,
// tracestate) and baggage. Setup installs it globally.
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// Tracer returns the global provider's tracer for the project's own
// spans, scoped by name (the package making them).
func Tracer(name string) trace.Tracer { return otel.Tracer(name) }

// Handler wraps h so that every request it answers gets a server span,
// child of the trace context in the request's headers (otelhttp), named
// after the method (and the route, when h is an http.ServeMux). Requests
// for the paths in skip (scrapes and probes: /metrics, /healthz) get none.
// service is the operation name otelhttp records.
//
// While no tracer provider is installed (Setup installs one only to
// export), a span would record nothing: the request then only gets the
// trace context of its headers, which its log lines and the requests it
// sends carry on (see untraced).
func Handler(service string, h http.Handler, skip ...string) http.Handler {
	traced := otelhttp.NewHandler(h, service,
		otelhttp.WithFilter(func(r *http.Request) bool { return !slices.Contains(skip, r.URL.Path) }))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !untraced() {
			traced.ServeHTTP(w, r)
			return
		}
		if ctx := otel.GetTextMapPropagator().Extract(r.Context(), propagation.HeaderCarrier(r.Header)); ctx != r.Context() {
			r = r.WithContext(ctx)
		}
		h.ServeHTTP(w, r)
	})
}

// Transport wraps base (http.DefaultTransport when nil) so that every
// request sent gets a client span and carries the caller's trace context
// in its headers (traceparent). Wrap a request signer (an ID-token
// transport) so that the span covers it. While no tracer provider is
// installed, a request gets no span, only the caller's trace context.
func Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &transport{traced: otelhttp.NewTransport(base), base: base}
}

// transport is Transport's RoundTripper.
type transport struct{ traced, base http.RoundTripper }

func (t *transport) RoundTrip(r *http.Request) (*http.Response, error) {
	if !untraced() {
		return t.traced.RoundTrip(r)
	}
	h := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(r.Context(), h)
	if len(h) == 0 {
		return t.base.RoundTrip(r)
	}
	r = r.Clone(r.Context()) // a RoundTripper must not change its caller's request
	for k, v := range h {
		r.Header.Set(k, v)
	}
	return t.base.RoundTrip(r)
}

// defaultProvider is OpenTelemetry's global tracer provider before one is
// installed: its spans record nothing and go nowhere.
var defaultProvider = otel.GetTracerProvider()

// untraced reports whether the global tracer provider records nothing:
// none was installed (Setup installs one only to export), or a no-op one
// was. Handler and Transport then skip otelhttp's span, attributes and
// metrics (whose meter is a no-op too: nothing here installs a meter
// provider), which nobody reads, and only carry the trace context.
func untraced() bool {
	tp := otel.GetTracerProvider()
	if _, ok := tp.(noop.TracerProvider); ok {
		return true
	}
	return tp == defaultProvider
}

// Inject writes the trace context of ctx into attrs (a Pub/Sub message's
// attributes; traceparent, and tracestate and baggage when present),
// replacing what attrs carried under those names. It does nothing when ctx
// carries no span.
func Inject(ctx context.Context, attrs map[string]string) {
	otel.GetTextMapPropagator().Inject(ctx, propagation.MapCarrier(attrs))
}

// Extract returns ctx with the trace context carried in attrs (as Inject
// wrote it) as its remote parent; ctx unchanged when attrs carry none.
func Extract(ctx context.Context, attrs map[string]string) context.Context {
	return otel.GetTextMapPropagator().Extract(ctx, propagation.MapCarrier(attrs))
}
