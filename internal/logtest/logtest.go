// Package logtest collects the JSON log lines a service writes during a
// test, so that the test can assert on named events (fenced_out, ...).
// It is imported by tests only.
package logtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"sync"
	"testing"
)

// Buffer is an io.Writer for slog.NewJSONHandler, safe for concurrent
// writers. The zero value is ready to use.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// Events returns, in order, the decoded lines whose "event" attribute is
// name. A line that is not JSON fails the test: every service logs JSON.
func (b *Buffer) Events(t testing.TB, name string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, m := range b.Lines(t) {
		if m["event"] == name {
			out = append(out, m)
		}
	}
	return out
}

// Lines returns every line written so far, decoded, in order. A line that
// is not JSON fails the test.
func (b *Buffer) Lines(t testing.TB) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b.buf.Bytes()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}
