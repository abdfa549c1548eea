package fuzztest_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/fuzztest"
)

func jsonHeader() http.Header { return http.Header{"Content-Type": {"application/json"}} }

func TestCheck(t *testing.T) {
	env := func(code, msg string) []byte {
		return []byte(`{"error":{"code":"` + code + `","message":"` + msg + `","retryable":false}}`)
	}
	for _, tc := range []struct {
		name   string
		a      fuzztest.Answer
		opts   fuzztest.Options
		inputs []string
		want   string // "" = passes; else a piece of the error
	}{
		{"a refusal with the envelope", fuzztest.Answer{400, jsonHeader(), env("INVALID_REQUEST", "bad")}, fuzztest.Options{}, nil, ""},
		{"a 200 with any JSON", fuzztest.Answer{200, jsonHeader(), []byte(`{"ok":true}`)}, fuzztest.Options{}, nil, ""},
		{"a 500", fuzztest.Answer{500, jsonHeader(), env("INTERNAL", "internal error")}, fuzztest.Options{}, nil, "5xx"},
		{"a documented 503", fuzztest.Answer{503, jsonHeader(), env("UNAVAILABLE", "down")}, fuzztest.Options{Allow5xx: []int{503}}, nil, ""},
		{"a redirect", fuzztest.Answer{307, http.Header{}, nil}, fuzztest.Options{}, nil, "redirect"},
		{"a plain-text 404", fuzztest.Answer{404, http.Header{"Content-Type": {"text/plain"}}, []byte("404 page not found")}, fuzztest.Options{}, nil, "not an error envelope"},
		{"an envelope without a code", fuzztest.Answer{409, jsonHeader(), env("", "x")}, fuzztest.Options{}, nil, "empty code"},
		{"an envelope with extra fields", fuzztest.Answer{409, jsonHeader(), []byte(`{"error":{"code":"X","message":"m"},"attempt":{}}`)}, fuzztest.Options{}, nil, "not an error envelope"},
		{"extra fields where allowed", fuzztest.Answer{409, jsonHeader(), []byte(`{"error":{"code":"X","message":"m"},"attempt":{}}`)}, fuzztest.Options{ExtraEnvelopeFields: true}, nil, ""},
		{"SQL in a message", fuzztest.Answer{400, jsonHeader(), env("X", `ERROR: invalid byte sequence for encoding \"UTF8\": 0xff (SQLSTATE 22021)`)}, fuzztest.Options{}, nil, "leaks"},
		{"a socket address", fuzztest.Answer{200, jsonHeader(), []byte(`{"db":"127.0.0.1:5432"}`)}, fuzztest.Options{}, nil, "127.0.0.1:"},
		{"a file path", fuzztest.Answer{400, jsonHeader(), env("X", "open /tmp/rail.jsonl: no space")}, fuzztest.Options{}, nil, "/tmp/"},
		{"a Go type", fuzztest.Answer{400, jsonHeader(), env("X", "json: cannot unmarshal string into Go struct field")}, fuzztest.Options{}, nil, "Go struct field"},
		{"the client's own text echoed", fuzztest.Answer{400, jsonHeader(), env("X", `key \"127.0.0.1:80\" is malformed`)}, fuzztest.Options{}, []string{"127.0.0.1:80"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := fuzztest.Check(tc.a, tc.opts, tc.inputs...)
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
		if got := fuzztest.Canonical(p); got != want {
			t.Errorf("Canonical(%q) = %v; want %v", p, got, want)
		}
	}
}
