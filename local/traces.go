package main

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// maxExport bounds the body of one OTLP export the sink accepts.
const maxExport = 16 << 20

// traceSink is the local stack's trace receiver (`local up -traces FILE`):
// an OTLP/HTTP endpoint on a loopback port that appends every export it
// receives to a file, one span per line as a flat JSON object (span), so
// that a payout's spans can be read with grep or jq without a collector:
// the ids are hex, as in the services' log lines (traceId, spanId). Every process of the stack exports to it
// through OTEL_EXPORTER_OTLP_ENDPOINT.
type traceSink struct {
	srv  *http.Server
	done chan struct{} // closed when Serve has returned

	mu sync.Mutex // guards f
	f  *os.File
}

// startTraceSink opens path for appending and serves OTLP/HTTP on a free
// loopback port; endpoint is the URL for OTEL_EXPORTER_OTLP_ENDPOINT.
// Close stops it.
func startTraceSink(path string) (s *traceSink, endpoint string, err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, "", fmt.Errorf("trace file: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Close()
		return nil, "", fmt.Errorf("trace sink: %w", err)
	}
	s = &traceSink{f: f, done: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", s.export)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { // ends when Close shuts the server down
		defer close(s.done)
		_ = s.srv.Serve(ln)
	}()
	return s, "http://" + ln.Addr().String(), nil
}

// export decodes one OTLP/HTTP protobuf export and appends it as a line.
func (s *traceSink) export(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = http.MaxBytesReader(w, r.Body, maxExport)
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		defer zr.Close()
		body = io.LimitReader(zr, maxExport)
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		http.Error(w, "not an OTLP protobuf trace export: "+err.Error(), http.StatusBadRequest)
		return
	}
	var lines []byte
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				line, err := json.Marshal(spanLine(service, sp))
				if err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				lines = append(append(lines, line...), '\n')
			}
		}
	}
	s.mu.Lock()
	_, err = s.f.Write(lines)
	s.mu.Unlock()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	resp, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(resp)
}

// Close stops the sink after the exports in flight (the processes flush
// theirs as they stop, which is before this runs) and closes the file.
func (s *traceSink) Close(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	if cerr := s.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// span is one line of the trace file.
type span struct {
	Service  string         `json:"service"`
	Name     string         `json:"name"`
	TraceID  string         `json:"traceId"`
	SpanID   string         `json:"spanId"`
	ParentID string         `json:"parentSpanId,omitempty"`
	Kind     string         `json:"kind"`
	Start    time.Time      `json:"start"`
	Ms       float64        `json:"durationMs"`
	Status   string         `json:"status,omitempty"`
	Attrs    map[string]any `json:"attributes,omitempty"`
}

func spanLine(service string, sp *tracepb.Span) span {
	l := span{
		Service: service, Name: sp.GetName(), TraceID: hex.EncodeToString(sp.GetTraceId()), SpanID: hex.EncodeToString(sp.GetSpanId()),
		ParentID: hex.EncodeToString(sp.GetParentSpanId()), Kind: sp.GetKind().String(),
		Start: time.Unix(0, int64(sp.GetStartTimeUnixNano())).UTC(),
		Ms:    float64(sp.GetEndTimeUnixNano()-sp.GetStartTimeUnixNano()) / 1e6,
	}
	if sp.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR {
		l.Status = "error: " + sp.GetStatus().GetMessage()
	}
	for _, kv := range sp.GetAttributes() {
		if l.Attrs == nil {
			l.Attrs = map[string]any{}
		}
		l.Attrs[kv.GetKey()] = value(kv.GetValue())
	}
	return l
}

// value is an attribute's value as JSON writes it (a token stays a number).
func value(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	}
	return v.String()
}
