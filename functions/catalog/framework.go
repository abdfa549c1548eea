package catalog

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"sync"

	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/serve"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpserve"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
)

// Log events of a function served by functions-framework-go
// (docs/log-events.md, section "Every function process").
const (
	// EventFunctionBuilt (INFO): the function's handler was built, on
	// its first request.
	EventFunctionBuilt = "function_built"
)

// CodeNotStarted is the error code of the 503 answered while the
// function cannot be built; the next request tries again.
const CodeNotStarted = "FUNCTION_NOT_STARTED"

// Lazy is a function as functions-framework-go serves it: built on its
// first request, from the environment its functions/cmd main reads and by
// the same code (serve.Build), so that it answers as serve.Main's process
// does. A build that fails is logged, answered 503 CodeNotStarted and
// tried again by the next request. The framework has no shutdown hook:
// what the handler holds is released by the end of the process, as after
// a crash (leases end by their TTL).
type Lazy struct {
	f       Function
	getenv  func(string) string
	environ func() []string

	mu sync.Mutex
	h  http.Handler // nil until built
}

// Lazy returns f built on first use from getenv (environ lists the
// variables set, for the unknown-variable warning).
func (f Function) Lazy(getenv func(string) string, environ func() []string) *Lazy {
	return &Lazy{f: f, getenv: getenv, environ: environ}
}

// ServeHTTP is the HTTP function: the function's handler with its metrics
// at serve.PathMetrics and httpserve.Canonical in front.
func (l *Lazy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h, err := l.handler()
	if err != nil {
		jsonhandler.WriteError(w, http.StatusServiceUnavailable, CodeNotStarted, "the function could not start; its log says why", true)
		return
	}
	h.ServeHTTP(w, r)
}

// ReceivePubSub is the CloudEvent function of a Pub/Sub trigger
// (google.cloud.pubsub.topic.v1.messagePublished): the event's data, the
// message and its subscription in the push body's shape, is posted to the
// function's push endpoint at "/" and the answer becomes the event's
// result: nil for a 2xx (acknowledged; the framework answers 200 without a
// body), otherwise the same status with the answer's body as text.
// Such an event carries no orderingKey and no deliveryAttempt.
func (l *Lazy) ReceivePubSub(ctx context.Context, e event.Event) error {
	h, err := l.handler()
	if err != nil {
		return cehttp.NewResult(http.StatusServiceUnavailable, "%s", CodeNotStarted)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "/", bytes.NewReader(e.Data()))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if tp, ok := e.Extensions()["traceparent"].(string); ok {
		// A trigger's trace context (Distributed Tracing extension).
		req.Header.Set("Traceparent", tp)
	}
	var a answer
	h.ServeHTTP(&a, req)
	if a.status >= 200 && a.status < 300 {
		return nil
	}
	return cehttp.NewResult(a.status, "%s", a.body.String())
}

// handler builds the function once it can, under l.mu.
func (l *Lazy) handler() (http.Handler, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.h != nil {
		return l.h, nil
	}
	log, err := serve.Logger(l.f.Name, l.getenv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", l.f.Name, err)
		return nil, err
	}
	// The process's lifetime: the framework never ends it, so close is
	// never called.
	h, _, err := serve.Build(context.Background(), l.f.Name, l.f.EnvNames(), l.environ(), l.getenv, l.f.Build, log, l.f.Collectors()...)
	if err != nil {
		log.Error("function failed", "event", serve.EventFunctionFailed, "error", err.Error())
		return nil, err
	}
	log.Info("function built", "event", EventFunctionBuilt)
	l.h = httpserve.Canonical(h)
	return l.h, nil
}

// answer records the push endpoint's answer to one CloudEvent.
type answer struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (a *answer) Header() http.Header {
	if a.header == nil {
		a.header = http.Header{}
	}
	return a.header
}

func (a *answer) WriteHeader(status int) {
	if a.status == 0 {
		a.status = status
	}
}

func (a *answer) Write(p []byte) (int, error) {
	a.WriteHeader(http.StatusOK)
	return a.body.Write(p)
}
