package fuzzcheck_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/fuzzcheck"
)

func jsonHeader() http.Header { return http.Header{"Content-Type": {"application/json"}} }

func TestCheck(t *testing.T) {
	env := func(code, msg string) []byte {
		return []byte(`{"error":{"code":"` + code + `","message":"` + msg + `","retryable":false}}`)
	}
	for _, tc := range []struct {
		name   string
		a      fuzzcheck.Answer
		opts   fuzzcheck.Options
		inputs []string
		want   string // "" = passes; else a piece of the error
	}{
		{"a refusal with the envelope", fuzzcheck.Answer{400, jsonHeader(), env("INVALID_REQUEST", "bad")}, fuzzcheck.Options{}, nil, ""},
		{"a 200 with any JSON", fuzzcheck.Answer{200, jsonHeader(), []byte(`{"ok":true}`)}, fuzzcheck.Options{}, nil, ""},
		{"a 500", fuzzcheck.Answer{500, jsonHeader(), env("INTERNAL", "internal error")}, fuzzcheck.Options{}, nil, "5xx"},
		{"a documented 503", fuzzcheck.Answer{503, jsonHeader(), env("UNAVAILABLE", "down")}, fuzzcheck.Options{Allow5xx: []int{503}}, nil, ""},
		{"a redirect", fuzzcheck.Answer{307, http.Header{}, nil}, fuzzcheck.Options{}, nil, "redirect"},
		{"a plain-text 404", fuzzcheck.Answer{404, http.Header{"Content-Type": {"text/plain"}}, []byte("404 page not found")}, fuzzcheck.Options{}, nil, "not an error envelope"},
		{"an envelope without a code", fuzzcheck.Answer{409, jsonHeader(), env("", "x")}, fuzzcheck.Options{}, nil, "empty code"},
		{"an envelope with extra fields", fuzzcheck.Answer{409, jsonHeader(), []byte(`{"error":{"code":"X","message":"m"},"attempt":{}}`)}, fuzzcheck.Options{}, nil, "not an error envelope"},
		{"extra fields where allowed", fuzzcheck.Answer{409, jsonHeader(), []byte(`{"error":{"code":"X","message":"m"},"attempt":{}}`)}, fuzzcheck.Options{ExtraEnvelopeFields: true}, nil, ""},
		{"SQL in a message", fuzzcheck.Answer{400, jsonHeader(), env("X", `ERROR: invalid byte sequence for encoding \"UTF8\": 0xff (SQLSTATE 22021)`)}, fuzzcheck.Options{}, nil, "leaks"},
		{"a socket address", fuzzcheck.Answer{200, jsonHeader(), []byte(`{"db":"127.0.0.1:5432"}`)}, fuzzcheck.Options{}, nil, "127.0.0.1:"},
		{"a file path", fuzzcheck.Answer{400, jsonHeader(), env("X", "open /tmp/rail.jsonl: no space")}, fuzzcheck.Options{}, nil, "/tmp/"},
		{"a Go type", fuzzcheck.Answer{400, jsonHeader(), env("X", "json: cannot unmarshal string into Go struct field")}, fuzzcheck.Options{}, nil, "Go struct field"},
		{"the client's own text echoed", fuzzcheck.Answer{400, jsonHeader(), env("X", `key \"127.0.0.1:80\" is malformed`)}, fuzzcheck.Options{}, []string{"127.0.0.1:80"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := fuzzcheck.Check(tc.a, tc.opts, tc.inputs...)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Check: %v; want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Check: %v; want an error naming %q", err, tc.want)
			}
		})
	}
}

func TestCanonical(t *testing.T) {
	for p, want := range map[string]bool{
		"/v1/payouts/p-1": true, "/v1/payouts/": true, "/": true,
		"": false, "v1": false, "/a/../b": false, "/a/./b": false, "//": false, "/a//b": false, "/a/..": false,
	} {
		if got := fuzzcheck.Canonical(p); got != want {
			t.Errorf("Canonical(%q) = %v; want %v", p, got, want)
		}
	}
}
