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
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/client"
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

func envelope(code api.Code) string {
	b, _ := json.Marshal(api.ErrorEnvelope{Error: api.ErrorBody{Code: code, Message: "m", Retryable: code.Retryable()}})
	return string(b)
}

func TestEveryRefusalMatchesTheSentinelOfItsCode(t *testing.T) {
	sentinel := map[api.Code]error{
		api.CodeInvalidRequest: client.ErrInvalidRequest, api.CodeInvalidToken: client.ErrInvalidRequest,
		api.CodeBodyTooLarge: client.ErrInvalidRequest, api.CodeUnsupportedMediaType: client.ErrInvalidRequest,
		api.CodeAccountNotFound: client.ErrAccountNotFound, api.CodeAccountConflict: client.ErrAccountConflict,
		api.CodeCurrencyMismatch: client.ErrCurrencyMismatch, api.CodePayoutNotFound: client.ErrPayoutNotFound,
		api.CodePayoutConflict: client.ErrPayoutConflict, api.CodeFencedOut: client.ErrFencedOut,
		api.CodePayoutTermsMismatch: client.ErrTermsMismatch,
		api.CodePayoutFinished:      client.ErrPayoutFinished, api.CodePayoutInDoubt: client.ErrPayoutInDoubt,
		api.CodePayoutNotClaimed: client.ErrPayoutNotClaimed, api.CodeRailRefConflict: client.ErrRailRefConflict,
		api.CodePayoutNeedsAttention: client.ErrPayoutNeedsAttention,
		api.CodeUnavailable:          client.ErrUnavailable, api.CodeUnverifiedToken: client.ErrUnverifiedToken,
		api.CodeInvalidReceipt: client.ErrInvalidReceipt, api.CodeOverloaded: client.ErrOverloaded,
		api.CodeInsufficientFunds: client.ErrInsufficientFunds,
		api.CodeRequestCancelled:  client.ErrUnavailable, // never read by a caller that is still there
		// No sentinel: a wrong URL or client, or a bug.
		api.CodeNotFound: nil, api.CodeMethodNotAllowed: nil, api.CodeInternal: nil,
	}
	all := []error{client.ErrInvalidRequest, client.ErrAccountNotFound, client.ErrAccountConflict, client.ErrCurrencyMismatch,
		client.ErrPayoutNotFound, client.ErrPayoutConflict, client.ErrFencedOut, client.ErrPayoutFinished, client.ErrPayoutInDoubt,
		client.ErrPayoutNotClaimed, client.ErrRailRefConflict, client.ErrUnavailable, client.ErrUnverifiedToken, client.ErrInvalidReceipt,
		client.ErrPayoutNeedsAttention, client.ErrOverloaded, client.ErrInsufficientFunds, client.ErrTermsMismatch}
	for _, code := range api.Codes {
		want, listed := sentinel[code]
		if !listed {
			t.Errorf("code %s has no row in this test", code)
			continue
		}
		c, _ := client.New("http://pay.invalid", client.WithHTTPClient(answering(409, envelope(code), nil)))
		_, err := c.Payout(context.Background(), "p-1")
		var e *client.Error
		if !errors.As(err, &e) || e.Code != code || e.Status != 409 || e.Retryable != code.Retryable() {
			t.Errorf("%s: error %#v, want *Error with that code, status 409", code, err)
		}
		for _, s := range all {
			if got := errors.Is(err, s); got != (s == want) {
				t.Errorf("%s: errors.Is(err, %v) = %v, want %v", code, s, got, s == want)
			}
		}
	}
}

func TestAnswersWithoutAnEnvelopeAndLostAnswers(t *testing.T) {
	ctx := context.Background()
	c, _ := client.New("http://pay.invalid", client.WithHTTPClient(answering(502, "<html>bad gateway</html>", nil)))
	if _, err := c.Audit(ctx); !errors.Is(err, client.ErrUnavailable) {
		t.Errorf("502 without an envelope: %v, want ErrUnavailable", err)
	}
	c, _ = client.New("http://pay.invalid", client.WithHTTPClient(answering(400, "nope", nil)))
	if _, err := c.Audit(ctx); errors.Is(err, client.ErrUnavailable) || errors.Is(err, client.ErrInvalidRequest) {
		t.Errorf("400 without an envelope: %v, want a bare *Error", err)
	}
	c, _ = client.New("http://pay.invalid", client.WithHTTPClient(answering(200, "{not json", nil)))
	if _, err := c.Payout(ctx, "p-1"); !errors.Is(err, client.ErrUnavailable) {
		t.Errorf("undecodable 200: %v, want ErrUnavailable", err)
	}
	lost := errors.New("connection reset")
	c, _ = client.New("http://pay.invalid", client.WithHTTPClient(doerFunc(func(*http.Request) (*http.Response, error) { return nil, lost })))
	if _, err := c.Claim(ctx, "p-1", fencewire.Holder{Token: 7, Owner: "w"}, api.ClaimRequest{}); !errors.Is(err, client.ErrUnavailable) || !errors.Is(err, lost) {
		t.Errorf("transport error: %v, want ErrUnavailable wrapping it", err)
	}
}

func TestFencedWritesCarryTheHoldersHeadersAndBody(t *testing.T) {
	var got []*http.Request
	c, err := client.New("http://pay.invalid/prefix/", client.WithHTTPClient(answering(200, `{"payoutId":"p/1","state":"posted","debits":1}`, &got)))
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.PostResult(context.Background(), "p.1", fencewire.Holder{Token: 42, Proof: "v1.proof", Owner: "worker-a"},
		api.ResultRequest{Outcome: api.OutcomeAck, RailRef: "r-1", Receipt: "k.sig"})
	if err != nil || p.State != api.StatePosted || p.Debits != 1 {
		t.Fatalf("PostResult = %+v, %v", p, err)
	}
	r := got[0]
	if r.Method != http.MethodPost || r.URL.Path != "/prefix"+api.ResultPath("p.1") {
		t.Errorf("sent %s %s, want POST /prefix%s", r.Method, r.URL.Path, api.ResultPath("p.1"))
	}
	if r.Header.Get(api.HeaderToken) != "42" || r.Header.Get(api.HeaderOwner) != "worker-a" || r.Header.Get(api.HeaderProof) != "v1.proof" ||
		r.Header.Get("Content-Type") != "application/json" {
		t.Errorf("headers %v", r.Header)
	}
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body["outcome"] != "ACK" || body["railRef"] != "r-1" || body["receipt"] != "k.sig" || len(body) != 3 {
		t.Errorf("body %v (%v); want outcome, railRef and receipt only", body, err)
	}
}

func TestInvalidRequestsAreNotSent(t *testing.T) {
	ctx := context.Background()
	var got []*http.Request
	c, _ := client.New("http://pay.invalid", client.WithHTTPClient(answering(200, "{}", &got)))
	for name, call := range map[string]func() error{
		"claim token 0": func() error {
			_, err := c.Claim(ctx, "p-1", fencewire.Holder{Token: 0, Owner: "w"}, api.ClaimRequest{})
			return err
		},
		"claim id with a slash": func() error {
			_, err := c.Claim(ctx, "p/1", fencewire.Holder{Token: 1, Owner: "w"}, api.ClaimRequest{})
			return err
		},
		"claim terms without a currency": func() error {
			_, err := c.Claim(ctx, "p-1", fencewire.Holder{Token: 1, Owner: "w"}, api.ClaimRequest{AccountID: "a", AmountMinor: 1})
			return err
		},
		"result railToken > token": func() error {
			_, err := c.PostResult(ctx, "p-1", fencewire.Holder{Token: 5, Owner: "w"}, api.ResultRequest{Outcome: api.OutcomeAck, RailRef: "r", RailToken: 6})
			return err
		},
		"result without railRef": func() error {
			_, err := c.PostResult(ctx, "p-1", fencewire.Holder{Token: 5, Owner: "w"}, api.ResultRequest{Outcome: api.OutcomeDecline})
			return err
		},
		"account without opening balance": func() error {
			_, err := c.CreateAccount(ctx, api.AccountRequest{AccountID: "a", Currency: "EUR"})
			return err
		},
		"payout of 0": func() error {
			_, err := c.CreatePayout(ctx, api.PayoutRequest{PayoutID: "p", AccountID: "a", Currency: "EUR"})
			return err
		},
		"lower-case currency": func() error {
			_, err := c.CreatePayout(ctx, api.PayoutRequest{PayoutID: "p", AccountID: "a", AmountMinor: 1, Currency: "eur"})
			return err
		},
		"empty account id": func() error { _, err := c.Account(ctx, ""); return err },
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
	for _, u := range []string{"", "pay:8080", "ftp://h", "http://h/?q=1", "http://u:p@h"} {
		if _, err := client.New(u); err == nil {
			t.Errorf("New(%q) accepted", u)
		}
	}
	if _, err := client.New("http://h", client.WithHTTPClient(nil)); err == nil || !strings.Contains(err.Error(), "nil") {
		t.Errorf("WithHTTPClient(nil): %v", err)
	}
}

// A 503 with Retry-After hands its delay to the caller (the executor
// waits it before the next try of a report); an answer without one says 0.
func TestRefusalCarriesRetryAfter(t *testing.T) {
	for ra, want := range map[string]time.Duration{"1": time.Second, "": 0} {
		d := doerFunc(func(r *http.Request) (*http.Response, error) {
			w := httptest.NewRecorder()
			if ra != "" {
				w.Header().Set("Retry-After", ra)
			}
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, envelope(api.CodeUnavailable))
			return w.Result(), nil
		})
		c, _ := client.New("http://pay.invalid", client.WithHTTPClient(d))
		_, err := c.Payout(context.Background(), "p-1")
		var e *client.Error
		if !errors.As(err, &e) || !errors.Is(err, client.ErrUnavailable) || e.RetryAfter != want {
			t.Errorf("Retry-After %q: %#v; want DATABASE_UNAVAILABLE with RetryAfter %v", ra, err, want)
		}
	}
}
