package tfdriver

import (
	"errors"
	"regexp"
	"strings"
)

// transientErrors are the answers of Google APIs that Google documents as
// passing by themselves, as the google provider prints them in a failed
// apply: an API enabled moments ago, a service account or binding not yet
// visible everywhere, a concurrent change, a quota's rate, an unavailable
// backend.
var transientErrors = []struct {
	reason string
	re     *regexp.Regexp
}{
	{"an API enabled moments ago (403 SERVICE_DISABLED)", regexp.MustCompile(`(?s)Error 403:.*(SERVICE_DISABLED|has not been used in project .* before or it is disabled)`)},
	{"a service account created moments ago (400 does not exist)", regexp.MustCompile(`(?is)Error 400:.*service account .*does not exist`)},
	{"a conflicting concurrent change (409)", regexp.MustCompile(`Error 409:.*`)},
	{"a rate limit (429)", regexp.MustCompile(`Error 429:`)},
	{"an unavailable backend (503)", regexp.MustCompile(`Error 503:`)},
}

// Transient reports whether a failed step's error is one Google documents
// as transient, and which: labenv applies again once, after a wait, before
// it gives up. A 409 that says a resource already exists is not transient.
func Transient(err error) (reason string, ok bool) {
	if err == nil || !errors.Is(err, ErrStep) {
		return "", false
	}
	// Terraform wraps its diagnostics to the terminal's width.
	msg := strings.Join(strings.Fields(err.Error()), " ")
	for _, t := range transientErrors {
		m := t.re.FindString(msg)
		if m == "" || strings.Contains(m, "already exists") || strings.Contains(m, "alreadyExists") {
			continue
		}
		return t.reason, true
	}
	return "", false
}
