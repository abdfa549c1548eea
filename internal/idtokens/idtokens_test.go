package idtokens_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"golang.org/x/oauth2"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/idtokens"
)

type failing struct{}

func (failing) Token() (*oauth2.Token, error) { return nil, errors.New("no metadata server") }

func TestTokensGoOnlyToTheirAudience(t *testing.T) {
	var got = map[string]string{}
	srv := func(name string) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got[name] = r.Header.Get("Authorization")
		}))
		t.Cleanup(s.Close)
		return s
	}
	pay, lock := srv("pay"), srv("lock")
	var audiences []string
	tr, err := idtokens.New(context.Background(), nil, func(_ context.Context, aud string) (oauth2.TokenSource, error) {
		audiences = append(audiences, aud)
		return oauth2.StaticTokenSource(&oauth2.Token{AccessToken: "token-for-" + aud}), nil
	}, pay.URL+"/")
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: tr}
	for _, u := range []string{pay.URL + "/v1/payouts/p-1/claim", lock.URL + "/v1/locks/k/acquire"} {
		resp, err := c.Post(u, "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if len(audiences) != 1 || audiences[0] != pay.URL {
		t.Fatalf("audiences %q; want the service URL %s without a path", audiences, pay.URL)
	}
	if got["pay"] != "Bearer token-for-"+pay.URL {
		t.Errorf("payment-resource got Authorization %q", got["pay"])
	}
	if got["lock"] != "" {
		t.Errorf("lock-server got Authorization %q; want none", got["lock"])
	}
}

func TestNoTokenNoRequest(t *testing.T) {
	sent := false
	s := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { sent = true }))
	t.Cleanup(s.Close)
	tr, err := idtokens.New(context.Background(), nil, func(context.Context, string) (oauth2.TokenSource, error) { return failing{}, nil }, s.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (&http.Client{Transport: tr}).Get(s.URL); err == nil || sent {
		t.Fatalf("a request went out without its token (err %v, sent %v)", err, sent)
	}
}

func TestAudiencesMustBeURLs(t *testing.T) {
	for _, a := range []string{"", "payment-resource", "ftp://x", "http://"} {
		_, err := idtokens.New(context.Background(), nil, func(context.Context, string) (oauth2.TokenSource, error) { return failing{}, nil }, a)
		if !errors.Is(err, idtokens.ErrAudience) {
			t.Errorf("audience %q: %v; want ErrAudience", a, err)
		}
	}
}
