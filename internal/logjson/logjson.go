// Package logjson builds the JSON loggers of the project's processes
// (New): slog's JSON lines, with the keys and level names Cloud Logging
// reads on Google Cloud, and the trace and span ids of the context a line
// is logged with, so that a line links to its trace. Log with the
// request's context (InfoContext, ...).
package logjson

import (
	"context"
	"io"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

// Keys a line gets inside a traced request.
const (
	// KeyTraceID is the trace id, 32 hex digits.
	KeyTraceID = "traceId"
	// KeySpanID is the id of the span current at the log call, 16 hex
	// digits.
	KeySpanID = "spanId"
	// KeyCloudTrace is Cloud Logging's trace field,
	// projects/PROJECT_ID/traces/TRACE_ID (Google Cloud, project known).
	KeyCloudTrace = "logging.googleapis.com/trace"
	// KeyCloudSpanID is Cloud Logging's span id field.
	KeyCloudSpanID = "logging.googleapis.com/spanId"
	// KeyCloudSampled is Cloud Logging's trace_sampled field (bool).
	KeyCloudSampled = "logging.googleapis.com/trace_sampled"
)

// EnvProject names the Google Cloud project whose Cloud Trace the lines
// link to (the conventional GOOGLE_CLOUD_PROJECT; the Terraform module
// sets it on every Cloud Run service). Unset, no KeyCloudTrace is written.
const EnvProject = "GOOGLE_CLOUD_PROJECT"

// Project returns the project id of EnvProject through getenv, "" when
// unset.
func Project(getenv func(string) string) string { return getenv(EnvProject) }

// EnvCloudRun is set by Cloud Run in every container (the service's
// name); EnvKubernetes by Kubernetes (GKE) in every pod. Either makes
// New use Cloud Logging's keys.
const (
	EnvCloudRun   = "K_SERVICE"
	EnvKubernetes = "KUBERNETES_SERVICE_HOST"
)

// OnGoogleCloud reports whether getenv describes a Cloud Run container or
// a Kubernetes pod, where the logs go to Cloud Logging.
func OnGoogleCloud(getenv func(string) string) bool {
	return getenv(EnvCloudRun) != "" || getenv(EnvKubernetes) != ""
}

// New returns a logger writing one JSON object per line to w, at level and
// above. With cloud, the level is written as "severity" (DEBUG, INFO,
// WARNING, ERROR) and the message as "message"; otherwise as slog writes
// them ("level", "msg").
//
// A line inside a traced request carries its trace and span ids (see the
// package doc); New never writes KeyCloudTrace (it needs the project:
// NewInProject).
func New(w io.Writer, level slog.Leveler, cloud bool) *slog.Logger {
	return NewInProject(w, level, cloud, "")
}

// NewInProject is New, and with cloud and a project id (Project), a line
// inside a traced request also carries KeyCloudTrace
// ("projects/PROJECT/traces/TRACE_ID"), KeyCloudSpanID and
// KeyCloudSampled, which link it to the trace in Cloud Trace.
func NewInProject(w io.Writer, level slog.Leveler, cloud bool, project string) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if cloud {
		opts.ReplaceAttr = cloudKeys
	} else {
		project = ""
	}
	return slog.New(TraceHandler(slog.NewJSONHandler(w, opts), project))
}

// TraceHandler wraps h: a record logged with a context that carries a
// valid span gets KeyTraceID and KeySpanID, and with project not empty
// the three Cloud Logging fields. The fields are added to the record, so
// under a WithGroup they land inside the group, as every attribute of
// the call does.
func TraceHandler(h slog.Handler, project string) slog.Handler {
	return &traceHandler{inner: h, project: project}
}

type traceHandler struct {
	inner   slog.Handler
	project string
}

func (h *traceHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h *traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		tid, sid := sc.TraceID().String(), sc.SpanID().String()
		r = r.Clone()
		r.AddAttrs(slog.String(KeyTraceID, tid), slog.String(KeySpanID, sid))
		if h.project != "" {
			r.AddAttrs(slog.String(KeyCloudTrace, "projects/"+h.project+"/traces/"+tid),
				slog.String(KeyCloudSpanID, sid), slog.Bool(KeyCloudSampled, sc.IsSampled()))
		}
	}
	return h.inner.Handle(ctx, r)
}

func (h *traceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &traceHandler{inner: h.inner.WithAttrs(as), project: h.project}
}

func (h *traceHandler) WithGroup(name string) slog.Handler {
	return &traceHandler{inner: h.inner.WithGroup(name), project: h.project}
}

// cloudKeys renames slog's top-level level and message keys for Cloud
// Logging; attributes inside groups are left alone.
func cloudKeys(groups []string, a slog.Attr) slog.Attr {
	if len(groups) > 0 {
		return a
	}
	switch a.Key {
	case slog.MessageKey:
		a.Key = "message"
	case slog.LevelKey:
		a.Key = "severity"
		lvl, _ := a.Value.Any().(slog.Level)
		a.Value = slog.StringValue(severity(lvl))
	}
	return a
}

// severity is Cloud Logging's LogSeverity name of a slog level.
func severity(l slog.Level) string {
	switch {
	case l >= slog.LevelError:
		return "ERROR"
	case l >= slog.LevelWarn:
		return "WARNING"
	case l >= slog.LevelInfo:
		return "INFO"
	}
	return "DEBUG"
}
