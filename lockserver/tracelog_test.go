package lockserver_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/logjson"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// tracedContext is a context carrying a remote span, as tracing.Handler
// leaves it after reading a request's traceparent.
func tracedContext(t *testing.T) context.Context {
	t.Helper()
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
	return trace.ContextWithRemoteSpanContext(t.Context(), sc)
}

// TestEveryRequestLineCarriesTheTraceID: every line lock-server writes
// while answering a traced request, the refusals and failures of fail()
// and the wait queue's lines included, carries the request's trace id
// (internal/logjson reads it from the log call's context). Before, fail()
// logged without the context and its lines could not be joined to the
// trace.
func TestEveryRequestLineCarriesTheTraceID(t *testing.T) {
	ctx := tracedContext(t)
	for _, tc := range []struct {
		name   string
		store  store.LockStore
		path   string
		body   string
		status int
	}{
		{"granted", memstore.New(nil), "/v1/locks/k/acquire", `{"owner":"w","ttlMs":60000}`, 200},
		{"bad key refused", memstore.New(nil), "/v1/locks/" + strings.Repeat("k", 600) + "/acquire", `{"owner":"w","ttlMs":60000}`, 400},
		{"bad body refused", memstore.New(nil), "/v1/locks/k/acquire", `{"owner":"w","ttlMs":-1}`, 400},
		{"stale renew refused", memstore.New(nil), "/v1/locks/k/renew", `{"owner":"w","token":99}`, 409},
		{"stale release refused", memstore.New(nil), "/v1/locks/k/release", `{"owner":"w","token":99}`, 409},
		{"backend down", downStore{memstore.New(nil)}, "/v1/locks/k/acquire", `{"owner":"w","ttlMs":60000}`, 503},
		{"queued then held", heldStore(t), "/v1/locks/k/acquire", `{"owner":"w2","ttlMs":60000,"waitMs":10}`, 409},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			h, err := lockserver.NewServer(tc.store, lockserver.DefaultServerConfig(), logjson.New(&buf, slog.LevelDebug, false))
			if err != nil {
				t.Fatal(err)
			}
			req := httptest.NewRequestWithContext(ctx, "POST", tc.path, strings.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.status {
				t.Fatalf("answer %d %s; want %d", rec.Code, rec.Body, tc.status)
			}
			lines := 0
			sc := bufio.NewScanner(&buf)
			for sc.Scan() {
				var l map[string]any
				if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
					t.Fatalf("not JSON: %s", sc.Bytes())
				}
				lines++
				if l[logjson.KeyTraceID] != tracedID(ctx) {
					t.Errorf("line without the request's trace id (%s = %v; want %s):\n%s", logjson.KeyTraceID, l[logjson.KeyTraceID], tracedID(ctx), sc.Bytes())
				}
			}
			if lines == 0 {
				t.Fatal("no line logged; the case checks nothing")
			}
		})
	}
}

func tracedID(ctx context.Context) string {
	return trace.SpanContextFromContext(ctx).TraceID().String()
}

// heldStore is a memstore whose key k is held by someone else for a
// minute, so that an acquire with a wait queues and ends LOCK_HELD.
func heldStore(t *testing.T) store.LockStore {
	t.Helper()
	s := memstore.New(nil)
	if _, err := s.Acquire(t.Context(), "k", "w1", time.Minute); err != nil {
		t.Fatal(err)
	}
	return s
}
