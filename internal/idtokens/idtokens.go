// Package idtokens lets one service call another private Cloud Run
// service: it adds a Google-signed ID token, whose audience is the called
// service's URL, to every request sent to that service's origin, and to no
// other (lock-server, reached over the VPC, gets none).
//
// Cloud Run refuses a request to a service without the allUsers invoker
// unless it carries such a token of an identity holding run.invoker on it
// (Terraform grants those: the executor on payment-resource and
// rail-proxy, rail-proxy on rail-stub). Locally nothing is private and the
// package is not used.
package idtokens

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"golang.org/x/oauth2"
	"google.golang.org/api/idtoken"
)

// ErrAudience: an audience is not an absolute http(s) URL.
var ErrAudience = errors.New("idtokens: audience must be an http(s) URL")

// SourceFunc makes the token source of one audience. Google (the
// default) gets tokens from the metadata server on Cloud Run and GKE, or
// from Application Default Credentials of a service account elsewhere.
type SourceFunc func(ctx context.Context, audience string) (oauth2.TokenSource, error)

// Google is the SourceFunc of production: google.golang.org/api/idtoken,
// which caches each token until shortly before it expires.
func Google(ctx context.Context, audience string) (oauth2.TokenSource, error) {
	return idtoken.NewTokenSource(ctx, audience)
}

// Enabled reads the switch of variable name from its value v: "" (unset)
// is false, otherwise true/false, 1/0 as strconv.ParseBool reads them. The
// error names the variable.
func Enabled(name, v string) (bool, error) {
	if strings.TrimSpace(v) == "" {
		return false, nil
	}
	on, err := strconv.ParseBool(strings.TrimSpace(v))
	if err != nil {
		return false, fmt.Errorf("%s=%q: want true or false", name, v)
	}
	return on, nil
}

// Transport sends requests through Base, with "Authorization: Bearer" and
// an ID token for the audience whose origin (scheme and host) the request
// goes to. A request to another origin is sent as it is. When no token can
// be had, the request is not sent and RoundTrip returns the error.
type Transport struct {
	// Base sends the requests; nil means http.DefaultTransport.
	Base    http.RoundTripper
	sources map[string]oauth2.TokenSource // by origin
}

// New returns a Transport over base adding tokens for each audience (the
// called services' base URLs), from sources made by newSource (Google
// when nil). It returns ErrAudience for an audience that is not an http(s)
// URL, or the error of newSource.
func New(ctx context.Context, base http.RoundTripper, newSource SourceFunc, audiences ...string) (*Transport, error) {
	if newSource == nil {
		newSource = Google
	}
	t := &Transport{Base: base, sources: map[string]oauth2.TokenSource{}}
	for _, a := range audiences {
		u, err := url.Parse(a)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("%w: %q", ErrAudience, a)
		}
		// Cloud Run takes the service URL, without a path, as audience.
		aud := u.Scheme + "://" + u.Host
		src, err := newSource(ctx, aud)
		if err != nil {
			return nil, fmt.Errorf("idtokens: token source for %s: %w", aud, err)
		}
		t.sources[origin(u)] = src
	}
	return t, nil
}

func origin(u *url.URL) string { return strings.ToLower(u.Scheme + "://" + u.Host) }

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	src, ok := t.sources[origin(req.URL)]
	if !ok {
		return base.RoundTrip(req)
	}
	tok, err := src.Token()
	if err != nil {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, fmt.Errorf("idtokens: ID token for %s: %w", origin(req.URL), err)
	}
	r := req.Clone(req.Context()) // a RoundTripper must not modify the request
	r.Header.Set("Authorization", "Bearer "+tok.AccessToken)
	return base.RoundTrip(r)
}
