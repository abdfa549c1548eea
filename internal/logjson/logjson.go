// Package logjson builds the JSON loggers of the project's processes. The
// line format is slog's JSON, except on Google Cloud, where Cloud Logging
// reads a line's level from "severity" and its text from "message" (not
// slog's "level" and "msg"): there those two keys are renamed, and the
// levels spelled as Cloud Logging's LogSeverity names.
package logjson

import (
	"io"
	"log/slog"
)

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
func New(w io.Writer, level slog.Leveler, cloud bool) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if cloud {
		opts.ReplaceAttr = cloudKeys
	}
	return slog.New(slog.NewJSONHandler(w, opts))
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
