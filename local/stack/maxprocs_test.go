package stack

import (
	"slices"
	"testing"
)

// A service runs on ServiceMaxProcs Ps unless the environment chose
// GOMAXPROCS itself, which it then inherits unchanged, or the stack was
// asked for Go's default.
func TestServicesRunOnOnePUnlessTheEnvironmentSaysOtherwise(t *testing.T) {
	unset := func(string) (string, bool) { return "", false }
	set := func(k string) (string, bool) { return "4", k == "GOMAXPROCS" }
	env := []string{"PORT=1"}
	if got, want := withMaxProcs(slices.Clone(env), 0, unset), []string{"PORT=1", "GOMAXPROCS=1"}; !slices.Equal(got, want) {
		t.Errorf("environment without GOMAXPROCS: got %q; want %q", got, want)
	}
	if got := withMaxProcs(slices.Clone(env), 0, set); !slices.Equal(got, env) {
		t.Errorf("environment with GOMAXPROCS=4: got %q; want %q (inherited unchanged)", got, env)
	}
	if got := withMaxProcs(slices.Clone(env), GoDefaultMaxProcs, unset); !slices.Equal(got, env) {
		t.Errorf("GoDefaultMaxProcs: got %q; want %q (Go chooses)", got, env)
	}
}
