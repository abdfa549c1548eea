// Package jsonhttp is the transport core the payout services' typed
// clients share (functions/paymentresource/client, functions/railproxy/
// client): the check of a base URL, and one JSON request with a lock
// holder's headers, read back with a bounded body. Each client keeps its
// own error type, sentinels and envelope decoding; this package knows no
// service's codes. It imports only the standard library, so the clients
// stay free of drivers and frameworks.
package jsonhttp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Doer sends one HTTP request; *http.Client implements it.
type Doer interface {
	Do(*http.Request) (*http.Response, error)
}

// MaxAnswerBytes bounds the body read from an answer (1 MiB).
const MaxAnswerBytes = 1 << 20

// Errors of Do. ErrEncode means nothing was sent; ErrNoAnswer that the
// request may or may not have been received (its outcome is unknown).
var (
	// ErrEncode: the request could not be built (its body does not
	// encode, or the method or URL is malformed). Nothing was sent.
	ErrEncode = errors.New("jsonhttp: request not built")
	// ErrNoAnswer: no complete answer arrived (a transport error, a
	// timeout, a body cut short).
	ErrNoAnswer = errors.New("jsonhttp: no answer")
)

// BaseURL checks that raw is an absolute http(s) URL with an optional
// path prefix and no query, fragment or user info, and returns it without
// a trailing slash. who names the client in the error.
func BaseURL(who, raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("%s: base URL %q is not an absolute http(s) URL", who, raw)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("%s: base URL %q has a query, fragment or user info; give scheme, host and an optional path only", who, raw)
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// Holder is the lock holder a fenced write is made for, and the names of
// the headers that carry it (payoutevent.HeaderToken, HeaderOwner).
type Holder struct {
	// Token is the fencing token, sent as a decimal in TokenHeader.
	Token int64
	// Owner is sent in OwnerHeader when not empty.
	Owner string
	// Proof is sent in ProofHeader when not empty.
	Proof string
	// TokenHeader, OwnerHeader and ProofHeader are the headers' names.
	TokenHeader, OwnerHeader, ProofHeader string
}

// Do sends method url through d, with in encoded as the JSON body when it
// is not nil and the holder's headers when h is not nil, and returns the
// answer's status and body (at most MaxAnswerBytes). It returns an error
// wrapping ErrEncode when nothing was sent, ErrNoAnswer when no complete
// answer arrived; any status is an answer, for the caller to decode.
func Do(ctx context.Context, d Doer, method, url string, h *Holder, in any) (int, []byte, error) {
	a, err := DoAnswer(ctx, d, method, url, h, in)
	return a.Status, a.Body, err
}

// Answer is one answer read by DoAnswer.
type Answer struct {
	// Status is the HTTP status code (0 when nothing arrived).
	Status int
	// Header is the answer's header (nil when nothing arrived).
	Header http.Header
	// Body is the answer's body, at most MaxAnswerBytes.
	Body []byte
}

// DoAnswer is Do, returning the answer's header too (for Retry-After).
func DoAnswer(ctx context.Context, d Doer, method, url string, h *Holder, in any) (Answer, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return Answer{}, fmt.Errorf("%w: %v", ErrEncode, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return Answer{}, fmt.Errorf("%w: %v", ErrEncode, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if h != nil {
		req.Header.Set(h.TokenHeader, strconv.FormatInt(h.Token, 10))
		if h.Owner != "" {
			req.Header.Set(h.OwnerHeader, h.Owner)
		}
		if h.Proof != "" {
			req.Header.Set(h.ProofHeader, h.Proof)
		}
	}
	resp, err := d.Do(req)
	if err != nil {
		return Answer{}, fmt.Errorf("%w: %s %s: %w", ErrNoAnswer, method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, MaxAnswerBytes))
	if err != nil {
		return Answer{Status: resp.StatusCode, Header: resp.Header}, fmt.Errorf("%w: reading the answer %d to %s %s: %w", ErrNoAnswer, resp.StatusCode, method, req.URL.Path, err)
	}
	return Answer{Status: resp.StatusCode, Header: resp.Header, Body: raw}, nil
}

// MaxRetryAfter caps the Retry-After RetryAfter returns: a larger one is
// more likely a misconfigured proxy than a plan, and a caller that waited
// it would hold its lease and its delivery for nothing.
const MaxRetryAfter = 60 * time.Second

// RetryAfter reads the Retry-After of an answer in its delay-seconds form
// (a non-negative decimal integer; RFC 9110, section 10.2.3), capped at
// MaxRetryAfter. It returns 0 when the header is absent, malformed or in
// the HTTP-date form, which no service of this project sends.
func RetryAfter(h http.Header) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	secs, err := strconv.ParseInt(v, 10, 64)
	if v == "" || err != nil || secs <= 0 {
		return 0
	}
	if secs >= int64(MaxRetryAfter/time.Second) {
		return MaxRetryAfter
	}
	return time.Duration(secs) * time.Second
}

// Excerpt is raw as a message for people: trimmed, and cut to 512 bytes,
// for an answer that is not the expected envelope (a proxy's page, say).
func Excerpt(raw []byte) string {
	msg := strings.TrimSpace(string(raw))
	if len(msg) > 512 {
		msg = msg[:512]
	}
	return msg
}
