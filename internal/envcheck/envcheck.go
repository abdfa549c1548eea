// Package envcheck warns about environment variables that look like the
// project's configuration (Prefixes) but that a process does not read, a
// misspelt LOCK_TTL_MS say, which would otherwise be silently ignored.
// Each process calls Warn with the names it reads and os.Environ(); it
// logs one WARN line per unknown variable with the closest known name.
// Nothing is refused. It also holds the URL check of the configs.
package envcheck

import (
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
)

// Prefixes are the name prefixes of every environment variable the
// project's processes read (see docs/configuration.md), derived from those
// names: LOCK_ (lock-server, lockctl, the executor's LOCK_SERVER_URL),
// LOCKDB_, ETCD_, PAYMENT_ (payment-resource's switch, the executor's
// PAYMENT_RESOURCE_URL), PAYDB_, OUTBOX_, RAIL_ (rail-proxy, rail-stub,
// the executor's RAIL_PROXY_URL and RAIL_CALL_TIMEOUT_MS), RAILDB_,
// EXECUTOR_, LEASE_ and ACQUIRE_ (the executor's LEASE_TTL_MS and
// ACQUIRE_WAIT_MS), RECONCILER_ (the reconciler), PPROF_ (every service's
// PPROF_ADDR, internal/pprofserve). Left out on purpose: PORT, HOST and LOG_LEVEL (no
// project prefix; LOG_ and PUBSUB_ are also used by other tools and by
// Google's client libraries, e.g. PUBSUB_EMULATOR_HOST, so a warning there
// would be noise).
var Prefixes = []string{
	"LOCK_", "LOCKDB_", "ETCD_",
	"PAYMENT_", "PAYDB_", "OUTBOX_",
	"RAIL_", "RAILDB_",
	"EXECUTOR_", "LEASE_", "ACQUIRE_",
	"RECONCILER_", "PPROF_",
}

// EventUnknownVariable is the log event of Warn's lines.
const EventUnknownVariable = "config_unknown_variable"

// Unknown is a variable with one of Prefixes that the process does not read.
type Unknown struct {
	// Name is the variable's name as found in the environment.
	Name string
	// Suggestion is the known name closest to Name (edit distance at most
	// MaxSuggestDistance), or "" when none is that close.
	Suggestion string
}

// MaxSuggestDistance is the largest edit distance (Levenshtein: one
// insertion, deletion or substitution each) at which Find suggests a known
// name: enough for a dropped letter, a swapped pair or a missing _MS.
const MaxSuggestDistance = 3

// Find returns, sorted by name, the variables of environ ("NAME=value"
// entries, as os.Environ returns them) whose name starts with one of
// Prefixes and is not in known. Each name appears once.
func Find(known, environ []string) []Unknown {
	var out []Unknown
	seen := map[string]bool{}
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if name == "" || seen[name] || !hasPrefix(name) || slices.Contains(known, name) {
			continue
		}
		seen[name] = true
		out = append(out, Unknown{Name: name, Suggestion: closest(name, known)})
	}
	slices.SortFunc(out, func(a, b Unknown) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Warn logs one WARN line per variable Find returns, with event
// EventUnknownVariable, the variable's name (attribute "variable") and,
// when one is close, the known name it may have meant ("didYouMean").
// It returns what it logged.
func Warn(log *slog.Logger, known, environ []string) []Unknown {
	found := Find(known, environ)
	for _, u := range found {
		attrs := []any{"event", EventUnknownVariable, "variable", u.Name}
		if u.Suggestion != "" {
			attrs = append(attrs, "didYouMean", u.Suggestion)
		}
		log.Warn("environment variable with the project's prefix is not read by this process; it is ignored", attrs...)
	}
	return found
}

func hasPrefix(name string) bool {
	for _, p := range Prefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// closest returns the known name nearest to name, or "" when the nearest is
// farther than MaxSuggestDistance. Ties go to the earlier name in known.
func closest(name string, known []string) string {
	best, bestD := "", MaxSuggestDistance+1
	for _, k := range known {
		if d := distance(name, k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

// distance is the Levenshtein distance between a and b, over bytes
// (environment variable names are ASCII).
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// HTTPURL returns nil when v, the value of variable name, is an absolute
// http or https URL with a host, and otherwise an error naming the
// variable and quoting the value (callers wrap it in their package's
// invalid-config sentinel).
func HTTPURL(name, v string) error {
	p, err := url.Parse(v)
	if v == "" || err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
		return fmt.Errorf("%s=%q: want an absolute http(s) URL", name, v)
	}
	return nil
}
