package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/client"
)

// doerFunc is a Doer made of a function.
type doerFunc func(*http.Request) (*http.Response, error)

func (f doerFunc) Do(r *http.Request) (*http.Response, error) { return f(r) }

// answering returns a Doer that records each request and answers status
// and body.
func answering(status int, body string, got *[]*http.Request) client.Doer {
	return doerFunc(func(r *http.Request) (*http.Response, error) {
		if got != nil {
			*got = append(*got, r)
		}
		w := httptest.NewRecorder()
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
		return w.Result(), nil
	})
}

// first is the attempt a PAYOUT_ALREADY_SUBMITTED answer carries in these
// tests.
var first = api.Attempt{AttemptID: 3, PayoutID: "p-1", AccountID: "acct-7", AmountMinor: 2500, Currency: "EUR",
	Token: 7, OwnerID: "worker-a", State: api.StateAcked, RailRef: "rail-000001"}

// envelope is the body rail-proxy sends with code (an
// AlreadySubmittedAnswer for PAYOUT_ALREADY_SUBMITTED).
func envelope(code api.Code) string {
	body := api.ErrorBody{Code: code, Message: "m", Retryable: code.Retryable()}
	var b []byte
	if code == api.CodeAlreadySubmitted {
		b, _ = json.Marshal(api.AlreadySubmittedAnswer{Error: body, Attempt: first})
	} else {
		b, _ = json.Marshal(api.ErrorEnvelope{Error: body})
	}
	return string(b)
}

var valid = api.SubmitRequest{PayoutID: "p-1", AccountID: "acct-7", AmountMinor: 2500, Currency: "EUR", TermsSignature: "test-pay.sig"}

func TestEveryRefusalMatchesTheSentinelOfItsCode(t *testing.T) {
	sentinel := map[api.Code]error{
		api.CodeInvalidRequest: client.ErrInvalidRequest, api.CodeBodyTooLarge: client.ErrInvalidRequest,
		api.CodeUnsupportedMediaType: client.ErrInvalidRequest, api.CodeFencedOut: client.ErrFencedOut,
		api.CodeAlreadySubmitted: client.ErrAlreadySubmitted, api.CodeRailAmbiguous: client.ErrRailAmbiguous,
		api.CodeUnavailable: client.ErrUnavailable, api.CodeRestored: client.ErrRaildbRestored,
		api.CodeNotFound: client.ErrNotFound, api.CodeUnverifiedToken: client.ErrUnverifiedToken,
		api.CodeAttemptInFlight: client.ErrAttemptInFlight, api.CodeNotForwarded: client.ErrNotForwarded,
		api.CodeRailSubmittedTwice: client.ErrRailSubmittedTwice, api.CodeOverloaded: client.ErrOverloaded,
		api.CodeInvalidTerms: client.ErrInvalidTerms, api.CodeTermsKeyUnknown: client.ErrTermsKeyUnknown,
		api.CodeTermsUnsigned: client.ErrTermsUnsigned,
		api.CodeInvalidToken:  client.ErrInvalidRequest, api.CodeRailNotReached: client.ErrRailNotReached,
		api.CodePayoutStopped: client.ErrPayoutStopped, api.CodeRequestCancelled: client.ErrUnavailable,
		// No sentinel: a wrong client, or a bug.
		api.CodeMethodNotAllowed: nil, api.CodeInternal: nil,
	}
	all := []error{client.ErrInvalidRequest, client.ErrFencedOut, client.ErrAlreadySubmitted, client.ErrRailAmbiguous,
		client.ErrUnavailable, client.ErrRaildbRestored, client.ErrNotFound, client.ErrUnverifiedToken,
		client.ErrAttemptInFlight, client.ErrNotForwarded, client.ErrRailSubmittedTwice, client.ErrOverloaded, client.ErrInvalidTerms,
		client.ErrRailNotReached, client.ErrPayoutStopped, client.ErrTermsKeyUnknown, client.ErrTermsUnsigned}
	for _, code := range api.Codes {
		want, listed := sentinel[code]
		if !listed {
			t.Errorf("code %s has no row in this test", code)
			continue
		}
		c, _ := client.New("http://rail.invalid", client.WithHTTPClient(answering(409, envelope(code), nil)))
		_, err := c.Submit(context.Background(), fencewire.Holder{Token: 8, Owner: "worker-b"}, valid)
		var e *client.Error
		if !errors.As(err, &e) || e.Code != code || e.Status != 409 || e.Retryable != code.Retryable() {
			t.Errorf("%s: error %#v, want *Error with that code, status 409", code, err)
			continue
		}
		if (e.Attempt != nil) != (code == api.CodeAlreadySubmitted) {
			t.Errorf("%s: Attempt %+v; want the first attempt for %s only", code, e.Attempt, api.CodeAlreadySubmitted)
		}
		for _, s := range all {
			if got := errors.Is(err, s); got != (s == want) {
				t.Errorf("%s: errors.Is(err, %v) = %v, want %v", code, s, got, s == want)
			}
		}
	}
}

func TestAlreadySubmittedCarriesTheFirstAttempt(t *testing.T) {
	c, _ := client.New("http://rail.invalid", client.WithHTTPClient(answering(409, envelope(api.CodeAlreadySubmitted), nil)))
	_, err := c.Submit(context.Background(), fencewire.Holder{Token: 8, Owner: "worker-b"}, valid)
	var e *client.Error
	if !errors.As(err, &e) || e.Attempt == nil || *e.Attempt != first {
		t.Fatalf("error %v; want the first attempt %+v", err, first)
	}
	// An answer with that code but without a usable attempt says nothing
	// about what went before: the caller cannot act on it.
	for _, body := range []string{
		`{"error":{"code":"` + string(api.CodeAlreadySubmitted) + `","message":"m"}}`,
		`{"error":{"code":"` + string(api.CodeAlreadySubmitted) + `","message":"m"},"attempt":{"attemptId":3,"token":0}}`,
	} {
		c, _ := client.New("http://rail.invalid", client.WithHTTPClient(answering(409, body, nil)))
		_, err := c.Submit(context.Background(), fencewire.Holder{Token: 8, Owner: "worker-b"}, valid)
		if !errors.Is(err, client.ErrUnavailable) || errors.Is(err, client.ErrAlreadySubmitted) {
			t.Errorf("%s: %v; want ErrUnavailable, not ErrAlreadySubmitted", body, err)
		}
	}
}

func TestAnswersWithoutAnEnvelopeAndLostAnswers(t *testing.T) {
	ctx := context.Background()
	c, _ := client.New("http://rail.invalid", client.WithHTTPClient(answering(502, "<html>bad gateway</html>", nil)))
	if _, err := c.Submit(ctx, fencewire.Holder{Token: 8, Owner: "w"}, valid); !errors.Is(err, client.ErrUnavailable) || errors.Is(err, client.ErrRailAmbiguous) {
		t.Errorf("502 without an envelope: %v, want ErrUnavailable and not ErrRailAmbiguous", err)
	}
	c, _ = client.New("http://rail.invalid", client.WithHTTPClient(answering(400, "nope", nil)))
	if _, err := c.Submit(ctx, fencewire.Holder{Token: 8, Owner: "w"}, valid); errors.Is(err, client.ErrUnavailable) || errors.Is(err, client.ErrInvalidRequest) {
		t.Errorf("400 without an envelope: %v, want a bare *Error", err)
	}
	for _, body := range []string{"{not json", `{"status":"MAYBE","railRef":"r"}`, `{}`} {
		c, _ = client.New("http://rail.invalid", client.WithHTTPClient(answering(200, body, nil)))
		if _, err := c.Submit(ctx, fencewire.Holder{Token: 8, Owner: "w"}, valid); !errors.Is(err, client.ErrUnavailable) {
			t.Errorf("200 %s: %v, want ErrUnavailable", body, err)
		}
	}
	lost := errors.New("connection reset")
	c, _ = client.New("http://rail.invalid", client.WithHTTPClient(doerFunc(func(*http.Request) (*http.Response, error) { return nil, lost })))
	if _, err := c.Submit(ctx, fencewire.Holder{Token: 8, Owner: "w"}, valid); !errors.Is(err, client.ErrUnavailable) || !errors.Is(err, lost) {
		t.Errorf("transport error: %v, want ErrUnavailable wrapping it", err)
	}
}

func TestSubmitCarriesTheHoldersHeadersAndBody(t *testing.T) {
	var got []*http.Request
	c, err := client.New("http://rail.invalid/prefix/", client.WithHTTPClient(answering(200,
		`{"status":"DECLINE","railRef":"rail-000002","attemptId":4,"token":42}`, &got)))
	if err != nil {
		t.Fatal(err)
	}
	ans, err := c.Submit(context.Background(), fencewire.Holder{Token: 42, Proof: "v1.proof", Owner: "worker-a"}, valid)
	if err != nil || ans != (api.SubmitAnswer{Status: api.RailDecline, RailRef: "rail-000002", AttemptID: 4, Token: 42}) {
		t.Fatalf("Submit = %+v, %v", ans, err)
	}
	r := got[0]
	if r.Method != http.MethodPost || r.URL.Path != "/prefix"+api.PathSubmissions {
		t.Errorf("sent %s %s, want POST /prefix%s", r.Method, r.URL.Path, api.PathSubmissions)
	}
	if r.Header.Get(api.HeaderToken) != "42" || r.Header.Get(api.HeaderOwner) != "worker-a" || r.Header.Get(api.HeaderProof) != "v1.proof" ||
		r.Header.Get("Content-Type") != "application/json" {
		t.Errorf("headers %v", r.Header)
	}
	// The terms signature travels in its header, once, and not in the
	// body: a rail-proxy older than the terms check refuses unknown body
	// members but ignores a header.
	if got := r.Header.Values(api.HeaderTermsSignature); len(got) != 1 || got[0] != "test-pay.sig" {
		t.Errorf("header %s = %q; want [test-pay.sig]", api.HeaderTermsSignature, got)
	}
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body["payoutId"] != "p-1" || body["accountId"] != "acct-7" ||
		body["amountMinor"] != 2500.0 || body["currency"] != "EUR" || len(body) != 4 {
		t.Errorf("body %v (%v); want the four terms only", body, err)
	}
}

// A reconciliation with the payout's facts sends their terms signature in
// the header, as a submission does; one without facts sends none.
func TestReconcilePayoutCarriesTheTermsSignatureInItsHeader(t *testing.T) {
	var got []*http.Request
	c, err := client.New("http://rail.invalid", client.WithHTTPClient(answering(200,
		`{"outcome":"NONE","railToken":9,"resolved":true,"attempt":{"attemptId":1},"receipt":"r"}`, &got)))
	if err != nil {
		t.Fatal(err)
	}
	h := fencewire.Holder{Token: 9, Proof: "v1.proof", Owner: "reconciler"}
	if _, err := c.ReconcilePayout(context.Background(), h, api.ReconcileRequest{PayoutID: "p-1", AccountID: "acct-7", AmountMinor: 2500,
		Currency: "EUR", TermsSignature: "test-pay.sig"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reconcile(context.Background(), h, "p-2"); err != nil {
		t.Fatal(err)
	}
	if v := got[0].Header.Values(api.HeaderTermsSignature); len(v) != 1 || v[0] != "test-pay.sig" {
		t.Errorf("with facts: header %s = %q; want [test-pay.sig]", api.HeaderTermsSignature, v)
	}
	var body map[string]any
	if err := json.NewDecoder(got[0].Body).Decode(&body); err != nil || body["termsSignature"] != nil {
		t.Errorf("with facts: body %v (%v); want no termsSignature member", body, err)
	}
	if v := got[1].Header.Values(api.HeaderTermsSignature); len(v) != 0 {
		t.Errorf("without facts: header %s = %q; want none", api.HeaderTermsSignature, v)
	}
}

func TestReadsUseTheirPaths(t *testing.T) {
	ctx := context.Background()
	var got []*http.Request
	c, _ := client.New("http://rail.invalid", client.WithHTTPClient(answering(200, `{"accountId":"a:1","highWater":9}`, &got)))
	if hw, err := c.HighWater(ctx, "a:1"); err != nil || hw != 9 {
		t.Errorf("HighWater = %d, %v", hw, err)
	}
	c, _ = client.New("http://rail.invalid", client.WithHTTPClient(answering(200, `{"attempts":null}`, &got)))
	if list, err := c.Attempts(ctx, "p:1.a_b"); err != nil || list == nil || len(list) != 0 {
		t.Errorf("Attempts = %#v, %v; want an empty list", list, err)
	}
	if len(got) != 2 || got[0].URL.RequestURI() != api.HighWaterPath("a:1") || got[1].URL.Query().Get(api.QueryPayoutID) != "p:1.a_b" {
		t.Errorf("sent %v", got)
	}
}

func TestInvalidRequestsAreNotSent(t *testing.T) {
	ctx := context.Background()
	var got []*http.Request
	c, _ := client.New("http://rail.invalid", client.WithHTTPClient(answering(200, "{}", &got)))
	with := func(f func(*api.SubmitRequest)) api.SubmitRequest { r := valid; f(&r); return r }
	for name, call := range map[string]func() error{
		"token 0": func() error { _, err := c.Submit(ctx, fencewire.Holder{Token: 0, Owner: "w"}, valid); return err },
		"amount 0": func() error {
			_, err := c.Submit(ctx, fencewire.Holder{Token: 1, Owner: "w"}, with(func(r *api.SubmitRequest) { r.AmountMinor = 0 }))
			return err
		},
		"lower-case currency": func() error {
			_, err := c.Submit(ctx, fencewire.Holder{Token: 1, Owner: "w"}, with(func(r *api.SubmitRequest) { r.Currency = "eur" }))
			return err
		},
		"payout id with a slash": func() error {
			_, err := c.Submit(ctx, fencewire.Holder{Token: 1, Owner: "w"}, with(func(r *api.SubmitRequest) { r.PayoutID = "p/1" }))
			return err
		},
		"high-water of an empty account": func() error { _, err := c.HighWater(ctx, ""); return err },
		"attempts of a too long payout": func() error {
			_, err := c.Attempts(ctx, strings.Repeat("p", api.MaxPayoutIDLen+1))
			return err
		},
	} {
		if err := call(); !errors.Is(err, client.ErrInvalidRequest) {
			t.Errorf("%s: %v, want ErrInvalidRequest", name, err)
		}
	}
	if len(got) != 0 {
		t.Errorf("%d invalid requests were sent", len(got))
	}
}

func TestNewRefusesBadURLsAndNilDoer(t *testing.T) {
	for _, u := range []string{"", "rail:8080", "ftp://h", "http://h/?q=1", "http://u:p@h"} {
		if _, err := client.New(u); err == nil {
			t.Errorf("New(%q) accepted", u)
		}
	}
	if _, err := client.New("http://h", client.WithHTTPClient(nil)); err == nil || !strings.Contains(err.Error(), "nil") {
		t.Errorf("WithHTTPClient(nil): %v", err)
	}
}

// A 503 with Retry-After hands its delay to the caller (the executor
// waits it before the next try); an answer without one says 0.
func TestRefusalCarriesRetryAfter(t *testing.T) {
	for ra, want := range map[string]time.Duration{"1": time.Second, "": 0} {
		d := doerFunc(func(r *http.Request) (*http.Response, error) {
			w := httptest.NewRecorder()
			if ra != "" {
				w.Header().Set("Retry-After", ra)
			}
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, envelope(api.CodeOverloaded))
			return w.Result(), nil
		})
		c, _ := client.New("http://rail.invalid", client.WithHTTPClient(d))
		_, err := c.Submit(context.Background(), fencewire.Holder{Token: 8, Owner: "worker-b"}, valid)
		var e *client.Error
		if !errors.As(err, &e) || !errors.Is(err, client.ErrOverloaded) || e.RetryAfter != want {
			t.Errorf("Retry-After %q: %#v; want OVERLOADED with RetryAfter %v", ra, err, want)
		}
	}
}
