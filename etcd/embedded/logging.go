package embedded

import (
	"os"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// serveStoppedMsg is what embed logs at error level from every serving
// goroutine when a member is closed on purpose ("http: Server closed",
// "use of closed network connection", "grpc: the server has been
// stopped"). The default logger drops it when the error says so.
const serveStoppedMsg = "setting up serving from embedded etcd failed."

// defaultLogger returns the logger members use when Config.Logger is nil:
// JSON to stderr at error level, without stack traces, and without the
// error lines embed writes for every clean shutdown.
func defaultLogger() *zap.Logger {
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	core := zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.Lock(os.Stderr), zapcore.ErrorLevel)
	return zap.New(shutdownFilter{core})
}

func isStopped(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "closed") || strings.Contains(msg, "stopped")
}

// shutdownFilter drops serveStoppedMsg entries whose error says a server or
// connection was closed; it passes every other entry to the wrapped core.
type shutdownFilter struct{ zapcore.Core }

func (f shutdownFilter) With(fields []zapcore.Field) zapcore.Core {
	return shutdownFilter{f.Core.With(fields)}
}

func (f shutdownFilter) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if f.Enabled(ent.Level) {
		return ce.AddCore(ent, f)
	}
	return ce
}

func (f shutdownFilter) Write(ent zapcore.Entry, fields []zapcore.Field) error {
	if ent.Message == serveStoppedMsg {
		for _, fl := range fields {
			if err, ok := fl.Interface.(error); ok && fl.Type == zapcore.ErrorType && isStopped(err) {
				return nil
			}
		}
	}
	return f.Core.Write(ent, fields)
}
