package tracing_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
)

func env(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

func TestLoadConfigExportsNothingUnlessAsked(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"nothing set", nil, tracing.ExporterNone},
		{"endpoint", map[string]string{tracing.EnvEndpoint: "http://collector:4318"}, tracing.ExporterOTLP},
		{"traces endpoint", map[string]string{tracing.EnvTracesEndpoint: "http://collector:4318/v1/traces"}, tracing.ExporterOTLP},
		{"exporter otlp", map[string]string{tracing.EnvTracesExporter: "otlp"}, tracing.ExporterOTLP},
		{"exporter none wins over an endpoint", map[string]string{tracing.EnvTracesExporter: "none", tracing.EnvEndpoint: "http://c:4318"}, tracing.ExporterNone},
		{"sdk disabled wins", map[string]string{tracing.EnvSDKDisabled: "true", tracing.EnvTracesExporter: "otlp"}, tracing.ExporterNone},
		{"http/protobuf", map[string]string{tracing.EnvEndpoint: "http://c:4318", tracing.EnvProtocol: "http/protobuf"}, tracing.ExporterOTLP},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tracing.LoadConfig(env(tc.env))
			if err != nil || c.Exporter != tc.want {
				t.Fatalf("LoadConfig = %+v, %v; want exporter %q", c, err, tc.want)
			}
		})
	}
}

func TestLoadConfigRefusesWhatIsNotBuiltIn(t *testing.T) {
	for _, tc := range []map[string]string{
		{tracing.EnvTracesExporter: "zipkin"},
		{tracing.EnvTracesExporter: "otlp,console"},
		{tracing.EnvEndpoint: "http://c:4317", tracing.EnvProtocol: "grpc"},
		{tracing.EnvTracesExporter: "otlp", tracing.EnvTracesProtocol: "http/json"},
	} {
		if _, err := tracing.LoadConfig(env(tc)); !errors.Is(err, tracing.ErrInvalidConfig) {
			t.Errorf("LoadConfig(%v) = %v; want ErrInvalidConfig", tc, err)
		}
	}
	if err := (tracing.Config{Exporter: "jaeger"}).Validate(); !errors.Is(err, tracing.ErrInvalidConfig) {
		t.Errorf("Validate(jaeger) = %v; want ErrInvalidConfig", err)
	}
}

// restoreGlobals puts a no-op provider and propagator back when t ends.
func restoreGlobals(t *testing.T) {
	t.Cleanup(func() {
		otel.SetTracerProvider(noop.NewTracerProvider())
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator())
	})
}

// collector is an OTLP/HTTP receiver that keeps the bodies posted to
// /v1/traces.
type collector struct {
	mu     sync.Mutex
	bodies [][]byte
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	if r.URL.Path == "/v1/traces" && r.Method == http.MethodPost {
		c.mu.Lock()
		c.bodies = append(c.bodies, b)
		c.mu.Unlock()
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
}

// With OTEL_EXPORTER_OTLP_ENDPOINT set, Setup exports spans over OTLP/HTTP
// to it, with the service's name, and its shutdown flushes them.
func TestSetupExportsOTLPOverHTTPToTheEndpoint(t *testing.T) {
	restoreGlobals(t)
	col := &collector{}
	srv := httptest.NewServer(col)
	defer srv.Close()
	t.Setenv(tracing.EnvEndpoint, srv.URL) // the exporter reads it itself
	cfg, err := tracing.LoadConfig(func(k string) string { return map[string]string{tracing.EnvEndpoint: srv.URL}[k] })
	if err != nil {
		t.Fatal(err)
	}
	shutdown, err := tracing.Setup(t.Context(), "svc-under-test", cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	_, span := tracing.Tracer("test").Start(context.Background(), "span-under-test")
	span.End()
	if err := shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	all := bytes.Join(col.bodies, nil)
	for _, want := range []string{"span-under-test", "svc-under-test"} {
		if !bytes.Contains(all, []byte(want)) {
			t.Errorf("the collector received %d bodies without %q", len(col.bodies), want)
		}
	}
}

// Without an exporter, Setup still installs the W3C propagator: a
// process passes its caller's trace on.
func TestSetupWithoutExporterStillPropagates(t *testing.T) {
	restoreGlobals(t)
	if _, err := tracing.Setup(t.Context(), "svc", tracing.DefaultConfig(), slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})
	attrs := map[string]string{"payoutId": "p-1"}
	tracing.Inject(trace.ContextWithSpanContext(context.Background(), parent), attrs)
	if attrs["traceparent"] == "" || attrs["payoutId"] != "p-1" {
		t.Fatalf("attributes after Inject: %v; want a traceparent beside payoutId", attrs)
	}
	got := trace.SpanContextFromContext(tracing.Extract(context.Background(), attrs))
	if got.TraceID() != parent.TraceID() || got.SpanID() != parent.SpanID() || !got.IsRemote() {
		t.Fatalf("Extract = %v; want the remote span context %v", got, parent)
	}
}

// A request sent through Transport to a server behind Handler is one
// trace: the server span is the child of the client span, itself the
// child of the caller's span; probes get no span.
func TestTransportAndHandlerCarryTheTrace(t *testing.T) {
	restoreGlobals(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(tracing.Propagator())
	var inHandler trace.SpanContext
	srv := httptest.NewServer(tracing.Handler("svc", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/work" {
			inHandler = trace.SpanContextFromContext(r.Context())
		}
	}), "/healthz"))
	defer srv.Close()
	c := &http.Client{Transport: tracing.Transport(nil)}
	ctx, parent := tp.Tracer("test").Start(context.Background(), "caller")
	for _, path := range []string{"/work", "/healthz"} {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	parent.End()
	if err := tp.ForceFlush(t.Context()); err != nil {
		t.Fatal(err)
	}
	var server, client []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		switch s.SpanKind {
		case trace.SpanKindServer:
			server = append(server, s)
		case trace.SpanKindClient:
			client = append(client, s)
		}
	}
	if len(server) != 1 || len(client) != 2 {
		t.Fatalf("%d server and %d client spans; want 1 (the probe has none) and 2", len(server), len(client))
	}
	if server[0].SpanContext.TraceID() != parent.SpanContext().TraceID() {
		t.Errorf("server span in trace %s; want the caller's %s", server[0].SpanContext.TraceID(), parent.SpanContext().TraceID())
	}
	if server[0].Parent.SpanID() != client[0].SpanContext.SpanID() && server[0].Parent.SpanID() != client[1].SpanContext.SpanID() {
		t.Errorf("server span's parent %s is no client span", server[0].Parent.SpanID())
	}
	if inHandler.SpanID() != server[0].SpanContext.SpanID() {
		t.Errorf("the handler's context carries span %s; want the server span %s", inHandler.SpanID(), server[0].SpanContext.SpanID())
	}
}

// roundTripper records the requests it is given and answers 204.
type roundTripper struct{ got []*http.Request }

func (rt *roundTripper) RoundTrip(r *http.Request) (*http.Response, error) {
	rt.got = append(rt.got, r)
	return &http.Response{StatusCode: http.StatusNoContent, Body: http.NoBody, Request: r}, nil
}

// With a provider that records nothing, Handler and Transport make no
// span and no metric (otelhttp's labeler is nowhere in a context), yet the
// caller's trace context still reaches the handler, and a request without
// one is passed on as it is.
func TestUntracedRequestsCarryOnlyTheTraceContext(t *testing.T) {
	restoreGlobals(t)
	otel.SetTracerProvider(noop.NewTracerProvider())
	otel.SetTextMapPropagator(tracing.Propagator())
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})
	var (
		inHandler trace.SpanContext
		labeled   bool
	)
	srv := httptest.NewServer(tracing.Handler("svc", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inHandler = trace.SpanContextFromContext(r.Context())
		_, labeled = otelhttp.LabelerFromContext(r.Context())
	})))
	defer srv.Close()
	req, err := http.NewRequestWithContext(trace.ContextWithSpanContext(context.Background(), parent), http.MethodGet, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: tracing.Transport(nil)}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if inHandler.TraceID() != parent.TraceID() || inHandler.SpanID() != parent.SpanID() {
		t.Errorf("the handler's span context is %v; want the caller's %v", inHandler, parent)
	}
	if labeled {
		t.Error("the handler's context holds otelhttp's labeler: the request went through otelhttp")
	}
	rt := &roundTripper{}
	tr := tracing.Transport(rt)
	bare, err := http.NewRequest(http.MethodGet, "http://127.0.0.1:1/", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.RoundTrip(bare); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	if rt.got[0] != bare {
		t.Error("a request without trace context was copied; want it passed on as it is")
	}
	for i, r := range rt.got {
		if _, ok := otelhttp.ClientLabelerFromContext(r.Context()); ok {
			t.Errorf("request %d went through otelhttp (its context holds the client labeler)", i)
		}
	}
	if got, want := rt.got[1].Header.Get("traceparent"), "00-"+parent.TraceID().String()+"-"+parent.SpanID().String()+"-01"; got != want {
		t.Errorf("traceparent sent: %q; want %q", got, want)
	}
	if req.Header.Get("traceparent") != "" {
		t.Error("the caller's request was changed; want a copy with the traceparent")
	}
}

func TestLoadConfigSignsForGooglesTelemetryAPI(t *testing.T) {
	for _, tc := range []struct {
		name        string
		env         map[string]string
		auth        bool
		project     string
		errContains string
	}{
		{"a collector", map[string]string{tracing.EnvEndpoint: "http://collector:4318", tracing.EnvGoogleProject: "lab-1"}, false, "", ""},
		{"base URL", map[string]string{tracing.EnvEndpoint: "https://telemetry.googleapis.com", tracing.EnvGoogleProject: "lab-1"}, true, "lab-1", ""},
		{"traces URL and port", map[string]string{tracing.EnvTracesEndpoint: "https://telemetry.googleapis.com:443/v1/traces", tracing.EnvGoogleProject: "lab-1"}, true, "lab-1", ""},
		{"the resource names the project", map[string]string{tracing.EnvEndpoint: "https://telemetry.googleapis.com",
			tracing.EnvGoogleProject: "lab-1", tracing.EnvResourceAttributes: "team=x, gcp.project_id=lab-2"}, true, "lab-2", ""},
		{"no project", map[string]string{tracing.EnvEndpoint: "https://telemetry.googleapis.com"}, true, "", "GOOGLE_CLOUD_PROJECT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tracing.LoadConfig(env(tc.env))
			if c.GoogleAuth != tc.auth || c.GoogleProject != tc.project {
				t.Errorf("LoadConfig = %+v; want GoogleAuth %v, project %q", c, tc.auth, tc.project)
			}
			if tc.errContains == "" && err != nil || tc.errContains != "" && (!errors.Is(err, tracing.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.errContains)) {
				t.Errorf("LoadConfig error = %v; want one naming %q", err, tc.errContains)
			}
		})
	}
}

// With GoogleAuth, every export carries an OAuth access token from
// Application Default Credentials (here a service account key whose token
// endpoint is local) and the resource names the project.
func TestSetupSignsExportsWithApplicationDefaultCredentials(t *testing.T) {
	restoreGlobals(t)
	tokens := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"access_token":"token-from-adc","token_type":"Bearer","expires_in":3600}`))
	}))
	defer tokens.Close()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	sa, _ := json.Marshal(map[string]string{
		"type": "service_account", "project_id": "lab-1", "private_key_id": "k1",
		"private_key":  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email": "executor@lab-1.iam.gserviceaccount.com", "client_id": "1", "token_uri": tokens.URL,
	})
	file := filepath.Join(t.TempDir(), "sa.json")
	if err := os.WriteFile(file, sa, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", file)

	var mu sync.Mutex
	var auth []string
	col := &collector{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auth = append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
		col.ServeHTTP(w, r)
	}))
	defer srv.Close()
	t.Setenv(tracing.EnvEndpoint, srv.URL)
	cfg := tracing.Config{Exporter: tracing.ExporterOTLP, Endpoint: srv.URL, GoogleAuth: true, GoogleProject: "lab-1"}
	shutdown, err := tracing.Setup(t.Context(), "executor", cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	_, span := tracing.Tracer("test").Start(context.Background(), "signed-span")
	span.End()
	if err := shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(auth) == 0 {
		t.Fatal("nothing was exported")
	}
	for _, a := range auth {
		if a != "Bearer token-from-adc" {
			t.Errorf("an export carried Authorization %q; want the ADC token", a)
		}
	}
	all := bytes.Join(col.bodies, nil)
	for _, want := range []string{"signed-span", tracing.AttrGCPProjectID, "lab-1"} {
		if !bytes.Contains(all, []byte(want)) {
			t.Errorf("the export lacks %q", want)
		}
	}
	if err := (tracing.Config{Exporter: tracing.ExporterOTLP, GoogleAuth: true}).Validate(); !errors.Is(err, tracing.ErrInvalidConfig) {
		t.Errorf("Validate(GoogleAuth without a project) = %v; want ErrInvalidConfig", err)
	}
}
