package harness

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/envcheck"
)

// TestNewFixtureReduces checks the reduction on hand-written logs: token
// labels, the events left out, plain lines skipped, the raw excerpt.
func TestNewFixtureReduces(t *testing.T) {
	dir := t.TempDir()
	logs := map[string]string{
		"lock-server": `{"time":"t","event":"server_started"}
{"time":"t","event":"lock_granted","owner":"A","token":7}
{"time":"t","event":"acquire_refused","owner":"B","code":"LOCK_HELD"}
{"time":"t","event":"lease_renewed","owner":"A","token":7}
{"time":"t","event":"renew_refused","owner":"A","token":7,"code":"STALE_TOKEN"}
{"time":"t","event":"lock_granted","owner":"B","token":9}`,
		"executor-A":       "Serving function: \"\"\n" + `{"time":"t","event":"self_stop","token":7,"pid":1}`,
		"rail-proxy":       `{"time":"t","event":"fenced_out","resource":"rail","presentedToken":7,"highestToken":9,"ownerId":"A","token":8}`,
		"payment-resource": `{"time":"t","event":"request_refused","path":"/","code":"NOT_FOUND"}`,
	}
	for _, p := range FixtureProcesses {
		if err := os.WriteFile(filepath.Join(dir, p+".log"), []byte(logs[p]+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r := &Run{Dir: dir, Cell: Cell{true, true}, Summary: Summary{Backend: "x", TokenA: 7, TokenB: 9}}
	f, err := NewFixture(r)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]KeyEvent{
		"lock-server":      {{Event: "lock_granted", Owner: "A", Token: "A"}, {Event: "lock_granted", Owner: "B", Token: "B"}},
		"executor-A":       {{Event: "self_stop", Token: "A"}},
		"executor-B":       {},
		"rail-proxy":       {{Event: "fenced_out", Owner: "A", Token: "other", PresentedToken: "A", HighestToken: "B", Resource: "rail"}},
		"payment-resource": {},
		"rail-stub":        {},
	}
	for p, w := range want {
		if !slices.Equal(f.Services[p], w) {
			t.Errorf("%s: %+v; want %+v", p, f.Services[p], w)
		}
	}
	if len(f.Raw) != 2 || f.Raw[0].Process != "executor-A" || f.Raw[1].Process != "rail-proxy" {
		t.Errorf("raw excerpt %+v; want the self_stop and fenced_out lines", f.Raw)
	}
	js, err := f.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var back Fixture
	if err := back.UnmarshalJSON(js); err != nil {
		t.Fatal(err)
	}
	if d := f.Diff(&back); d != "" {
		t.Errorf("a fixture differs from itself after a JSON round trip:\n%s", d)
	}
}

func TestLineDiff(t *testing.T) {
	got := strings.Join(lineDiff([]string{"a", "b", "c"}, []string{"a", "x", "c", "d"}), "|")
	if want := "  a|- b|+ x|  c|+ d"; got != want {
		t.Errorf("lineDiff = %q; want %q", got, want)
	}
}

// TestFixturesLeaveOutUnknownVariableWarnings: whether a process warns
// about an unknown variable depends on the runner's environment, so the
// warning is no key event of the experiment.
func TestFixturesLeaveOutUnknownVariableWarnings(t *testing.T) {
	if !skipEvent(envcheck.EventUnknownVariable, map[string]any{"variable": "LOCK_TTL"}) {
		t.Errorf("skipEvent(%s) = false; want it left out of fixtures", envcheck.EventUnknownVariable)
	}
}
