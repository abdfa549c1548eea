package literaltest_test

import (
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/literaltest"
)

// moduleRoot returns the module's root folder, two levels above this
// package.
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found at %s: %v", root, err)
	}
	return root
}

// TestNoEventNameIsALiteral checks every non-test Go file of the module:
// the "event" attribute of a log line is always a constant of the package
// that owns the event (an api package, or the service's own package), so
// that renaming an event is one edit and every reader follows it.
func TestNoEventNameIsALiteral(t *testing.T) {
	root := moduleRoot(t)
	found, files, err := literaltest.EventsInModule(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		t.Errorf("%s; use the owning package's Event constant", f)
	}
	if files < 50 {
		t.Fatalf("checked only %d files under %s; the walk is broken", files, root)
	}
}

// TestEventLiteralsFindsAPlantedLiteral shows that the check above can
// fail: each planted literal event name is reported, and constants, other
// attributes and lists that are not attributes are not.
func TestEventLiteralsFindsAPlantedLiteral(t *testing.T) {
	src := `package p
func f() {
	log.Info("lease granted", "event", "lease_acquired", "token", 7)
	log.Warn("refused", append([]any{"event", op + "_refused"}, attrs...)...)
	log.With("event", "http_server_error")
	log.LogAttrs(ctx, slog.LevelInfo, "x", slog.String("event", "payout_posted"))
	_ = map[string]any{"event": "fenced_out"}
	log.Info("fine", "event", api.EventPayoutPosted, "note", "event")
	log.Info("fine", "event", events[op].refused)
	_ = []string{"time", "event", "service"}
}
`
	found, err := literaltest.EventsInSource(token.NewFileSet(), "planted.go", src)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`"lease_acquired"`, `"_refused"`, `"http_server_error"`, `"payout_posted"`, `"fenced_out"`}
	if len(found) != len(want) {
		t.Fatalf("found %d literals, want %d: %q", len(found), len(want), found)
	}
	for i, w := range want {
		if !strings.Contains(found[i], "event name "+w+" spelled as a literal") {
			t.Errorf("finding %d = %q, want it to name %s", i, found[i], w)
		}
	}
}

// TestEveryEventIsDocumented checks that docs/log-events.md names every
// event constant of the module (as `name`), so that the table operators
// query from cannot fall behind the code.
func TestEveryEventIsDocumented(t *testing.T) {
	root := moduleRoot(t)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "log-events.md"))
	if err != nil {
		t.Fatal(err)
	}
	events, err := literaltest.EventConstants(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) < 50 {
		t.Fatalf("found only %d event constants under %s; the walk is broken", len(events), root)
	}
	for name, where := range events {
		if !strings.Contains(string(doc), "`"+name+"`") {
			t.Errorf("event %q (%s) is not in docs/log-events.md", name, strings.Join(where, ", "))
		}
	}
}

// sharedEvents are the event names more than one package declares, each
// on purpose: the same thing seen from two sides, with one meaning (the
// executor's payout_posted is payment-resource's, reported by the
// worker that asked for it). Any other name declared twice is a clash:
// two services giving one name two meanings, as the executor's and
// rail-proxy's rail_submission_stopped did; an operator's
// query for one would find both.
var sharedEvents = map[string]string{
	"payout_claimed":            "the claim, by payment-resource and by the executor that asked",
	"payout_posted":             "the posted result, by payment-resource and by the executor that reported it",
	"payout_declined":           "the declined result, likewise",
	"payout_ambiguous":          "the ambiguous result, likewise",
	"payout_needs_attention":    "the needs_attention mark, likewise",
	"lease_released":            "the release, by lock-server and by the executor that asked",
	"rail_submission_ambiguous": "the rail's unknown outcome, by rail-proxy and by the executor it answered",
	"rail_request_failed":       "a failed request, by rail-proxy and by rail-stub (each logs its own)",
	"backend_stalled":           "internal/overload's breaker, whose names payment-resource re-exports",
	"backend_recovered":         "internal/overload's breaker, likewise",
}

// TestNoEventNameHasTwoMeanings checks that an event name declared by
// more than one package is one of sharedEvents.
func TestNoEventNameHasTwoMeanings(t *testing.T) {
	events, err := literaltest.EventConstants(moduleRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	for name, where := range events {
		if len(where) > 1 && sharedEvents[name] == "" {
			t.Errorf("event %q is declared in %s: give each meaning its own name (or add it to sharedEvents if it is one fact seen from two sides)",
				name, strings.Join(where, ", "))
		}
	}
}
