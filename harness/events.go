package harness

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"syscall"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

// continueSignal resumes the stopped worker.
const continueSignal = syscall.SIGCONT

// Event is one structured log record that carries an "event" attribute.
type Event struct {
	// Time is the record's time.
	Time time.Time
	// Service is the "service" attribute ("lock-server", "executor", ...),
	// or "harness" for the harness's own steps.
	Service string
	// Name is the "event" attribute.
	Name string
	// Attrs are the other attributes, as decoded from JSON (numbers are
	// float64).
	Attrs map[string]any
}

// Str returns attribute k as a string ("" when absent or not a string).
func (e Event) Str(k string) string {
	s, _ := e.Attrs[k].(string)
	return s
}

// Int returns attribute k as an integer (0 when absent or not a number).
func (e Event) Int(k string) int64 {
	switch v := e.Attrs[k].(type) {
	case float64:
		return int64(v)
	case int64:
		return v
	case int:
		return int64(v)
	}
	return 0
}

// Owner returns the worker the event is about: the "ownerId" attribute of
// the functions and the harness, or lock-server's "owner".
func (e Event) Owner() string {
	if o := e.Str("ownerId"); o != "" {
		return o
	}
	return e.Str("owner")
}

// readEvents decodes every JSON log line with an "event" attribute from
// the processes' log files; other lines are skipped.
func readEvents(procs []*stack.Process) ([]Event, error) {
	var out []Event
	for _, p := range procs {
		b, err := p.Log()
		if err != nil {
			return nil, fmt.Errorf("log of %s: %w", p.Name(), err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) != nil {
				continue
			}
			name, _ := m["event"].(string)
			if name == "" {
				continue
			}
			e := Event{Name: name, Attrs: m}
			e.Service, _ = m["service"].(string)
			if ts, ok := m["time"].(string); ok {
				e.Time, _ = time.Parse(time.RFC3339Nano, ts)
			}
			for _, k := range []string{"time", "level", "msg", "event", "service"} {
				delete(m, k)
			}
			out = append(out, e)
		}
	}
	return out, nil
}

// mergeEvents returns a and b in time order (stable: equal times keep
// their order, a first).
func mergeEvents(a, b []Event) []Event {
	out := append(append([]Event(nil), a...), b...)
	slices.SortStableFunc(out, func(x, y Event) int { return x.Time.Compare(y.Time) })
	return out
}
