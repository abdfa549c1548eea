// Package fuzztest holds the properties every answer of the project's
// services must have whatever a client sends, for the fuzz targets and
// the bad-input table (docs/reliability.md): no 5xx and no redirect, the
// error envelope on every 4xx, no internal text in any body (Check).
// Snapshot lets a target check that a refused request changed nothing.
// Test code only.
package fuzztest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/http/httptest"
	"path"
	"strings"
)

// Answer is one HTTP answer as a test received it.
type Answer struct {
	// Status is the HTTP status code.
	Status int
	// Header holds the answer's headers.
	Header http.Header
	// Body is the whole body.
	Body []byte
}

// FromRecorder returns the answer a handler wrote into rec.
func FromRecorder(rec *httptest.ResponseRecorder) Answer {
	return Answer{Status: rec.Code, Header: rec.Header(), Body: rec.Body.Bytes()}
}

// Envelope is the error envelope's shape, decoded strictly.
type Envelope struct {
	// Error is the refusal.
	Error struct {
		Code      string `json:"code"`
		Message   string `json:"message"`
		Retryable bool   `json:"retryable"`
	} `json:"error"`
}

// DecodeEnvelope decodes body as the error envelope. It returns an error
// when body is not exactly one envelope object with a non-empty code and
// message; fields beyond the envelope's are allowed only when extra is
// true (rail-proxy's ALREADY_SUBMITTED answer adds the first attempt).
func DecodeEnvelope(body []byte, extra bool) (Envelope, error) {
	var env Envelope
	dec := json.NewDecoder(bytes.NewReader(body))
	if !extra {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(&env); err != nil {
		return env, fmt.Errorf("not an error envelope: %v", err)
	}
	if dec.More() {
		return env, errors.New("not an error envelope: data after the object")
	}
	if env.Error.Code == "" {
		return env, errors.New("error envelope with an empty code")
	}
	if env.Error.Message == "" {
		return env, errors.New("error envelope with an empty message")
	}
	return env, nil
}

// internalText lists what must never reach a client: it names the
// service's insides (its database, files, sockets, language), not the
// request. Each entry is matched case-sensitively.
var internalText = []string{
	// PostgreSQL and its drivers.
	"SQLSTATE", "ERROR:", "syntax error at or near", "violates ", "duplicate key value",
	"invalid byte sequence", "relation \"", "pgconn", "pgx", "pq: ",
	// Files.
	"/home/", "/tmp/", "/usr/", "/root/", "/work/", "/var/", ".go:",
	// Sockets.
	"127.0.0.1:", "[::1]:", "localhost:", "dial tcp", "connection refused", "broken pipe",
	// Go itself.
	"*errors.", "*fmt.", "*json.", "*url.", "*net.", "*http.", "*pgconn.", "*strconv.",
	"Go struct field", "Go value of type", "goroutine ", "panic:", "runtime error", "nil pointer",
	"context deadline exceeded", "context canceled",
}

// Leak returns the first piece of internal text in body that is not also
// in one of inputs (what the client sent: an echo of the request is not a
// leak), or "" when there is none. JSON escapes in body are decoded first
// when body is a JSON value.
func Leak(body []byte, inputs ...string) string {
	texts := []string{string(body)}
	var v any
	if json.Unmarshal(body, &v) == nil {
		texts = append(texts, stringsIn(v)...)
	}
	for _, pat := range internalText {
		for _, text := range texts {
			if strings.Contains(text, pat) && !anyContains(inputs, pat) {
				return pat
			}
		}
	}
	return ""
}

func anyContains(inputs []string, pat string) bool {
	for _, in := range inputs {
		if strings.Contains(in, pat) {
			return true
		}
	}
	return false
}

// stringsIn returns every string (keys included) in a decoded JSON value.
func stringsIn(v any) []string {
	switch v := v.(type) {
	case string:
		return []string{v}
	case []any:
		var out []string
		for _, e := range v {
			out = append(out, stringsIn(e)...)
		}
		return out
	case map[string]any:
		var out []string
		for k, e := range v {
			out = append(out, k)
			out = append(out, stringsIn(e)...)
		}
		return out
	}
	return nil
}

// Options adjust Check for one route.
type Options struct {
	// Allow5xx lists 5xx statuses that are a documented answer to this
	// request even with healthy dependencies (none, for client input).
	Allow5xx []int
	// ExtraEnvelopeFields accepts fields besides "error" in a 4xx body.
	ExtraEnvelopeFields bool
}

// Check returns an error naming every property a breaks; inputs are the
// strings the client sent (path, headers, body), see Leak.
func Check(a Answer, opts Options, inputs ...string) error {
	var errs []error
	switch {
	case a.Status >= 500:
		allowed := false
		for _, s := range opts.Allow5xx {
			allowed = allowed || s == a.Status
		}
		if !allowed {
			errs = append(errs, fmt.Errorf("status %d: a client's input must never cause a 5xx", a.Status))
		}
	case a.Status >= 300 && a.Status < 400:
		errs = append(errs, fmt.Errorf("status %d: a redirect instead of an answer", a.Status))
	case a.Status < 100:
		errs = append(errs, fmt.Errorf("status %d is not an HTTP status", a.Status))
	}
	if a.Status >= 400 {
		if mt, _, _ := mime.ParseMediaType(a.Header.Get("Content-Type")); mt != "application/json" {
			errs = append(errs, fmt.Errorf("status %d with Content-Type %q; want application/json", a.Status, a.Header.Get("Content-Type")))
		}
		if _, err := DecodeEnvelope(a.Body, opts.ExtraEnvelopeFields); err != nil {
			errs = append(errs, fmt.Errorf("status %d: %v", a.Status, err))
		}
	}
	if leak := Leak(a.Body, inputs...); leak != "" {
		errs = append(errs, fmt.Errorf("status %d: the body leaks internal text %q", a.Status, leak))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w\nbody: %.600s", errors.Join(errs...), a.Body)
}

// Canonical reports whether p is a path in canonical form (starts with
// "/", no ".", ".." or empty segments), the only form the services'
// routes answer. A handler given a non-canonical path may redirect: the
// server constructor refuses such paths before the handler, so
// handler-level targets leave them out.
func Canonical(p string) bool {
	if p == "" || p[0] != '/' || strings.Contains(p, "//") {
		return false
	}
	c := path.Clean(p)
	return c == p || c+"/" == p
}

// Methods are the methods a fuzz input picks from by index (see
// NewRequest): a request line's method is a token that net/http checks
// before any handler.
var Methods = []string{http.MethodPost, http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodOptions}

// NewRequest builds the request a fuzz input describes: Methods[method %
// len], the path as the server would have decoded it, up to its first
// "?", and what follows that as the raw query string (so that the targets
// fuzz query parameters too), the body, and headers as name, value pairs
// (an empty value leaves the header out). It returns ok=false when a
// header value holds CR, LF or NUL, which net/http refuses before any
// handler sees the request.
func NewRequest(method uint8, p string, body []byte, headers ...string) (r *http.Request, ok bool) {
	r = httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
	r.Method = Methods[int(method)%len(Methods)]
	p, query, _ := strings.Cut(p, "?")
	r.URL.Path, r.URL.RawPath, r.URL.RawQuery = p, "", query
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			continue
		}
		if strings.ContainsAny(headers[i+1], "\r\n\x00") {
			return nil, false
		}
		r.Header.Set(headers[i], headers[i+1])
	}
	return r, true
}
