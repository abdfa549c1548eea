// Package jsonclient is the transport core the payout services' typed
// clients share (functions/paymentresource/client, functions/railproxy/
// client): the check of a base URL, one JSON request with a lock
// holder's headers read back with a bounded body, the error envelope
// every service sends, and Conn, which holds all of it for a client. Each
// client keeps its own error type, sentinels and methods; this package
// knows no service's codes. It imports only the standard library and
// internal/jsonhandler (the envelope's type), so the clients stay free of
// drivers and frameworks.
package jsonclient

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

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
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
	ErrEncode = errors.New("jsonclient: request not built")
	// ErrNoAnswer: no complete answer arrived (a transport error, a
	// timeout, a body cut short).
	ErrNoAnswer = errors.New("jsonclient: no answer")
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
// the headers that carry it (fencewire.HeaderToken, HeaderOwner).
type Holder struct {
	// Token is the fencing token, sent as a decimal in TokenHeader.
	Token int64
	// Owner is sent in OwnerHeader when not empty.
	Owner string
	// Proof is sent in ProofHeader when not empty.
	Proof string
	// TokenHeader, OwnerHeader and ProofHeader are the headers' names.
	TokenHeader, OwnerHeader, ProofHeader string
	// Extra are more headers of the request, set as they are (rail-proxy's
	// payout-terms signature); nil for none.
	Extra http.Header
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
		for k, vs := range h.Extra {
			for _, v := range vs {
				req.Header.Add(k, v)
			}
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

// Conn is the part of a typed client that knows no service: its name for
// errors, its base URL and its transport, and the two sentinels its
// failures wrap. A client holds one and keeps only its own codes, error
// type and methods.
type Conn struct {
	who         string
	base        string
	doer        Doer
	invalid     error
	unavailable error
}

// ConnOption configures a Conn; the typed clients export it as their
// Option.
type ConnOption func(*Conn) error

// WithDoer sends a Conn's requests through d instead of
// http.DefaultClient. It fails (at NewConn) for a nil d.
func WithDoer(d Doer) ConnOption {
	return func(c *Conn) error {
		if d == nil {
			return fmt.Errorf("%s: WithHTTPClient(nil)", c.who)
		}
		c.doer = d
		return nil
	}
}

// NewConn returns a Conn for the service at baseURL (checked by BaseURL).
// who names the client in errors ("railproxy client"); invalid and
// unavailable are the client's sentinels for a request that was not sent
// and for one whose outcome is unknown (see Call). It returns an error for
// a malformed URL or an option that fails.
func NewConn(who, baseURL string, invalid, unavailable error, opts ...ConnOption) (*Conn, error) {
	base, err := BaseURL(who, baseURL)
	if err != nil {
		return nil, err
	}
	c := &Conn{who: who, base: base, doer: http.DefaultClient, invalid: invalid, unavailable: unavailable}
	for _, o := range opts {
		if err := o(c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Refusal is a non-2xx answer, read as the error envelope every service
// of this project sends ({"error":{"code","message","retryable"}}).
type Refusal struct {
	// Status is the HTTP status code.
	Status int
	// Code is the envelope's code; empty when the body was not an
	// envelope (a proxy's page, say).
	Code string
	// Message is the envelope's message, or Excerpt of the body when it
	// was not an envelope.
	Message string
	// Retryable is the envelope's retryable hint.
	Retryable bool
	// RetryAfter is the answer's Retry-After (see RetryAfter).
	RetryAfter time.Duration
	// Body is the answer's body, for a client whose envelope carries more
	// (rail-proxy's first attempt).
	Body []byte
}

// Call sends method on the Conn's base URL + path (see DoAnswer for h and
// in) and decodes a 2xx answer's body into out. It returns a nil Refusal
// and a nil error for a 2xx answer; a Refusal and a nil error for any
// other status; and no Refusal with an error wrapping the Conn's invalid
// sentinel when nothing was sent (ErrEncode), or its unavailable sentinel
// when no complete answer arrived or a 2xx body did not decode (the
// outcome is unknown).
func (c *Conn) Call(ctx context.Context, method, path string, h *Holder, in, out any) (*Refusal, error) {
	ans, err := DoAnswer(ctx, c.doer, method, c.base+path, h, in)
	switch {
	case errors.Is(err, ErrEncode):
		return nil, fmt.Errorf("%w: %v", c.invalid, err)
	case err != nil:
		return nil, fmt.Errorf("%w: %w", c.unavailable, err)
	case ans.Status/100 == 2:
		if err := json.Unmarshal(ans.Body, out); err != nil {
			return nil, fmt.Errorf("%w: undecodable answer %d to %s %s: %v", c.unavailable, ans.Status, method, path, err)
		}
		return nil, nil
	}
	r := &Refusal{Status: ans.Status, RetryAfter: RetryAfter(ans.Header), Body: ans.Body}
	var env jsonhandler.Envelope
	if json.Unmarshal(ans.Body, &env) != nil || env.Error.Code == "" {
		r.Message = Excerpt(ans.Body)
		return r, nil
	}
	r.Code, r.Message, r.Retryable = env.Error.Code, env.Error.Message, env.Error.Retryable
	return r, nil
}

// Matches is the errors.Is rule of the typed clients' Error types: a
// refusal with a code matches the sentinel of its code (sentinels), and
// one without a code and with a 5xx status matches unavailable.
func Matches[C ~string](sentinels map[C]error, code C, status int, target, unavailable error) bool {
	if s, ok := sentinels[code]; ok {
		return target == s
	}
	return code == "" && status >= 500 && target == unavailable
}
