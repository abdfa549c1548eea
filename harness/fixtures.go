package harness

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/envcheck"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/tracing"
)

// FixtureProcesses are the processes whose logs a Fixture reduces, in the
// order the fixture lists them.
var FixtureProcesses = []string{"lock-server", "executor-A", "executor-B", "rail-proxy", "payment-resource", "rail-stub"}

// KeyEvent is one log event reduced to what does not depend on timing or
// on the backend's absolute token numbers. Tokens are labels: "A" for A's
// lease token, "B" for B's, "other" for any other number.
type KeyEvent struct {
	// Event is the log event name.
	Event string `json:"event"`
	// Owner is the line's ownerId or owner attribute.
	Owner string `json:"owner,omitempty"`
	// Token, PresentedToken, HighestToken and AttemptToken are the line's
	// token attributes as labels.
	Token          string `json:"token,omitempty"`
	PresentedToken string `json:"presentedToken,omitempty"`
	HighestToken   string `json:"highestToken,omitempty"`
	AttemptToken   string `json:"attemptToken,omitempty"`
	// Resource is the fenced resource of a fenced_out line.
	Resource string `json:"resource,omitempty"`
	// Code is the error code of a refusal line.
	Code string `json:"code,omitempty"`
}

// RawLine is one log line kept verbatim, to show what the real logs look
// like.
type RawLine struct {
	// Process is the log file's process name (executor-A, rail-proxy, ...).
	Process string `json:"process"`
	// Line is the JSON log line, unchanged.
	Line json.RawMessage `json:"line"`
}

// Fixture is the deterministic part of one run's logs: per process, the
// ordered key events. Only the order within a process is meaningful; the
// interleaving across processes varies from run to run.
type Fixture struct {
	// Backend and Cell name the run.
	Backend string
	Cell    string
	// Services maps a process name to its key events, in log order.
	Services map[string][]KeyEvent
	// Raw holds A's self_stop line and the first fenced_out line, if any,
	// verbatim (times, pid and tokens included). It illustrates; only its
	// attribute names are compared (see Fixture.Diff).
	Raw []RawLine
}

// skipEvent reports whether an event is left out of fixtures: it says
// nothing about fencing, or whether and how often it happens depends on
// timing.
func skipEvent(name string, attrs map[string]any) bool {
	switch name {
	case "server_started", "server_stopping", "server_stopped", "function_started", "function_stopping", "function_stopped",
		"server_drain_timeout", "http_server_error", tracing.EventConfigured:
		// Process lifecycle: not part of the experiment, and a process
		// killed after its grace period never logs its stopping line.
		return true
	case "lease_renewed":
		// How many renewals fit in a lease's life depends on scheduling.
		return true
	case "acquire_queued", "handoff_failed":
		// The experiment logs at debug: whether B's acquire waits in the
		// key's queue, and whether a release hands off to it, depends on
		// timing.
		return true
	case envcheck.EventUnknownVariable:
		// Depends on the environment of whoever runs the experiment (the
		// stack passes its own on to every process), not on the run.
		return true
	case "request_refused":
		// The stack's readiness probe (GET /) is answered 404 one or more
		// times, depending on how fast the service starts.
		return attrs["path"] == "/"
	case railapi.EventRequestRefused:
		// rail-proxy's 404 to the same probe (DEBUG, without the path).
		return attrs["code"] == string(railapi.CodeNotFound)
	}
	if strings.HasPrefix(name, "renew_") {
		// A's background renewer may or may not reach lock-server after
		// SIGCONT before A finishes its work.
		return true
	}
	if strings.HasSuffix(name, "_refused") && attrs["code"] == "LOCK_HELD" {
		// Retries while another worker holds the lock: their number
		// depends on timing.
		return true
	}
	return false
}

// NewFixture reduces the logs of r's processes (files PROCESS.log in
// r.Dir) to a Fixture.
func NewFixture(r *Run) (*Fixture, error) {
	f := &Fixture{Backend: r.Summary.Backend, Cell: r.Cell.Name(), Services: map[string][]KeyEvent{}}
	label := func(v any) string {
		if v == nil {
			return ""
		}
		n, err := strconv.ParseInt(fmt.Sprint(v), 10, 64)
		switch {
		case err != nil:
			return fmt.Sprintf("invalid(%v)", v)
		case n == r.Summary.TokenA:
			return "A"
		case n == r.Summary.TokenB:
			return "B"
		}
		return "other"
	}
	var stop, fenced *RawLine
	for _, proc := range FixtureProcesses {
		b, err := os.ReadFile(filepath.Join(r.Dir, proc+".log"))
		if err != nil {
			return nil, err
		}
		evs := []KeyEvent{}
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			d := json.NewDecoder(bytes.NewReader(sc.Bytes()))
			d.UseNumber()
			var m map[string]any
			if d.Decode(&m) != nil {
				continue // "Serving function" and other plain lines
			}
			name, _ := m["event"].(string)
			if name == "" || skipEvent(name, m) {
				continue
			}
			owner, _ := m["ownerId"].(string)
			if owner == "" {
				owner, _ = m["owner"].(string)
			}
			resource, _ := m["resource"].(string)
			code, _ := m["code"].(string)
			evs = append(evs, KeyEvent{
				Event: name, Owner: owner, Resource: resource, Code: code,
				Token: label(m["token"]), PresentedToken: label(m["presentedToken"]),
				HighestToken: label(m["highestToken"]), AttemptToken: label(m["attemptToken"]),
			})
			line := &RawLine{Process: proc, Line: json.RawMessage(slices.Clone(sc.Bytes()))}
			if name == "self_stop" && stop == nil {
				stop = line
			}
			if name == fencewire.EventFencedOut && fenced == nil {
				fenced = line
			}
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("log of %s: %w", proc, err)
		}
		f.Services[proc] = evs
	}
	for _, l := range []*RawLine{stop, fenced} {
		if l != nil {
			f.Raw = append(f.Raw, *l)
		}
	}
	return f, nil
}

// MarshalJSON writes the fixture with one event per line, for readable
// files and diffs.
func (f *Fixture) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	str := func(s string) string { js, _ := json.Marshal(s); return string(js) }
	fmt.Fprintf(&b, "{\n  \"backend\": %s,\n  \"cell\": %s,\n", str(f.Backend), str(f.Cell))
	b.WriteString("  \"note\": \"generated by: go test ./harness -run TestFixtures -update; per process, the ordered key events of a real run; tokens: A = A's lease token, B = B's\",\n")
	b.WriteString("  \"services\": {\n")
	for i, proc := range FixtureProcesses {
		fmt.Fprintf(&b, "    %s: [", str(proc))
		for j, e := range f.Services[proc] {
			js, err := json.Marshal(e)
			if err != nil {
				return nil, err
			}
			sep := ","
			if j == len(f.Services[proc])-1 {
				sep = ""
			}
			fmt.Fprintf(&b, "\n      %s%s", js, sep)
		}
		if len(f.Services[proc]) > 0 {
			b.WriteString("\n    ")
		}
		b.WriteString("]")
		if i < len(FixtureProcesses)-1 {
			b.WriteString(",")
		}
		b.WriteString("\n")
	}
	b.WriteString("  },\n  \"rawExcerpt\": [")
	for i, l := range f.Raw {
		var line bytes.Buffer
		if err := json.Compact(&line, l.Line); err != nil {
			return nil, err
		}
		sep := ","
		if i == len(f.Raw)-1 {
			sep = ""
		}
		fmt.Fprintf(&b, "\n    {\"process\": %s, \"line\": %s}%s", str(l.Process), line.Bytes(), sep)
	}
	if len(f.Raw) > 0 {
		b.WriteString("\n  ")
	}
	b.WriteString("]\n}\n")
	if !json.Valid(b.Bytes()) {
		return nil, fmt.Errorf("fixture %s/%s: invalid JSON produced", f.Backend, f.Cell)
	}
	return b.Bytes(), nil
}

// UnmarshalJSON reads what MarshalJSON writes.
func (f *Fixture) UnmarshalJSON(b []byte) error {
	var v struct {
		Backend    string                `json:"backend"`
		Cell       string                `json:"cell"`
		Services   map[string][]KeyEvent `json:"services"`
		RawExcerpt []RawLine             `json:"rawExcerpt"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*f = Fixture{Backend: v.Backend, Cell: v.Cell, Services: v.Services, Raw: v.RawExcerpt}
	return nil
}

// Diff compares got (f) with want and returns "" when they agree, or a
// readable description of every difference: per process, a line diff of
// the key events ("-" only in want, "+" only in got), and for the raw
// excerpt, the attribute names that appeared or disappeared.
func (f *Fixture) Diff(want *Fixture) string {
	var b strings.Builder
	for _, proc := range FixtureProcesses {
		w, g := eventLines(want.Services[proc]), eventLines(f.Services[proc])
		if slices.Equal(w, g) {
			continue
		}
		fmt.Fprintf(&b, "%s: %d key events, want %d (- want, + got):\n", proc, len(g), len(w))
		for _, l := range lineDiff(w, g) {
			fmt.Fprintf(&b, "  %s\n", l)
		}
	}
	for _, wl := range want.Raw {
		wk, err := rawKeys(wl.Line)
		if err != nil {
			fmt.Fprintf(&b, "raw excerpt of %s in the fixture: %v\n", wl.Process, err)
			continue
		}
		event, _ := wk["event"].(string)
		var gl *RawLine
		for i := range f.Raw {
			if k, err := rawKeys(f.Raw[i].Line); err == nil && f.Raw[i].Process == wl.Process && k["event"] == event {
				gl = &f.Raw[i]
			}
		}
		if gl == nil {
			fmt.Fprintf(&b, "raw excerpt: no %s line in %s's log\n", event, wl.Process)
			continue
		}
		gk, _ := rawKeys(gl.Line)
		var gone, added []string
		for k := range wk {
			if _, ok := gk[k]; !ok {
				gone = append(gone, k)
			}
		}
		for k := range gk {
			if _, ok := wk[k]; !ok {
				added = append(added, k)
			}
		}
		if len(gone)+len(added) > 0 {
			slices.Sort(gone)
			slices.Sort(added)
			fmt.Fprintf(&b, "raw excerpt: %s line of %s: attributes gone %v, new %v\n", event, wl.Process, gone, added)
		}
	}
	return b.String()
}

func rawKeys(line json.RawMessage) (map[string]any, error) {
	var m map[string]any
	err := json.Unmarshal(line, &m)
	return m, err
}

func eventLines(evs []KeyEvent) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		js, _ := json.Marshal(e)
		out[i] = string(js)
	}
	return out
}

// lineDiff returns a minimal line diff of a to b (longest common
// subsequence): " x" in both, "-x" only in a, "+x" only in b.
func lineDiff(a, b []string) []string {
	n, m := len(a), len(b)
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out []string
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && a[i] == b[j]:
			out = append(out, "  "+a[i])
			i++
			j++
		case i < n && (j == m || lcs[i+1][j] >= lcs[i][j+1]):
			out = append(out, "- "+a[i])
			i++
		default:
			out = append(out, "+ "+b[j])
			j++
		}
	}
	return out
}
