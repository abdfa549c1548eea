package jsonclient

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestBaseURL(t *testing.T) {
	for raw, want := range map[string]string{
		"http://127.0.0.1:8080":      "http://127.0.0.1:8080",
		"https://x.example/prefix/":  "https://x.example/prefix",
		"ftp://x.example":            "",
		"/relative":                  "",
		"http://x.example/?a=1":      "",
		"http://user:pw@x.example":   "",
		"http://x.example/#fragment": "",
	} {
		got, err := BaseURL("test client", raw)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("BaseURL(%q) = %q, %v; want %q", raw, got, err, want)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "test client: ") {
			t.Errorf("BaseURL(%q) error %q does not name the client", raw, err)
		}
	}
}

func TestDoSendsTheHolderAndReadsAnyStatus(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusConflict)
		_, _ = w.Write([]byte(r.Header.Get("X-T") + " " + r.Header.Get("X-O") + " " + r.Header.Get("Content-Type") + " " + string(b)))
	}))
	defer srv.Close()
	status, raw, err := Do(context.Background(), http.DefaultClient, "POST", srv.URL+"/x",
		&Holder{Token: 42, Owner: "A", TokenHeader: "X-T", OwnerHeader: "X-O"}, map[string]int{"n": 1})
	if err != nil || status != http.StatusConflict || string(raw) != `42 A application/json {"n":1}` {
		t.Fatalf("Do = %d %q %v", status, raw, err)
	}
}

func TestDoAnswerReturnsTheHeaderAndRetryAfterReadsIt(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", r.URL.Query().Get("ra"))
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	for ra, want := range map[string]time.Duration{
		"1": time.Second, "7": 7 * time.Second, "": 0, "0": 0, "-3": 0, "1.5": 0, "soon": 0,
		"Wed, 21 Oct 2015 07:28:00 GMT": 0, "3600": MaxRetryAfter, "99999999999999999999": 0,
	} {
		a, err := DoAnswer(context.Background(), http.DefaultClient, "GET", srv.URL+"/x?ra="+url.QueryEscape(ra), nil, nil)
		if err != nil || a.Status != http.StatusServiceUnavailable {
			t.Fatalf("DoAnswer = %d %v", a.Status, err)
		}
		if got := RetryAfter(a.Header); got != want {
			t.Errorf("Retry-After %q read as %v; want %v", ra, got, want)
		}
	}
}

func TestDoErrors(t *testing.T) {
	if _, _, err := Do(context.Background(), http.DefaultClient, "POST", "http://127.0.0.1:1/x", nil, func() {}); !errors.Is(err, ErrEncode) {
		t.Errorf("an unencodable body: %v; want ErrEncode", err)
	}
	srv := httptest.NewServer(nil)
	base := srv.URL
	srv.Close()
	if _, _, err := Do(context.Background(), http.DefaultClient, "GET", base+"/x", nil, nil); !errors.Is(err, ErrNoAnswer) {
		t.Errorf("a closed server: %v; want ErrNoAnswer", err)
	}
	if got := Excerpt([]byte("  " + strings.Repeat("x", 600) + " ")); len(got) != 512 {
		t.Errorf("Excerpt is %d bytes; want 512", len(got))
	}
}

// The clients that use this package promise their callers nothing but the
// standard library; so must it. It shares the error envelope's one
// definition with internal/jsonhandler, which is held to the same rule
// here (its dependencies are among these).
func TestImportsOnlyTheStandardLibrary(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const internal = "github.com/distributed-lock-lab/distributed-lock-lab/internal/"
	for _, d := range strings.Fields(string(out)) {
		if d != internal+"jsonclient" && d != internal+"jsonhandler" {
			t.Errorf("internal/jsonclient depends on %s; want the standard library and internal/jsonhandler only", d)
		}
	}
}

func TestConnCallSortsEveryAnswer(t *testing.T) {
	errInvalid, errUnavailable := errors.New("invalid"), errors.New("unavailable")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			_, _ = w.Write([]byte(`{"n":7}`))
		case "/garbled":
			_, _ = w.Write([]byte(`{"n":`))
		case "/envelope":
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusConflict)
			_, _ = w.Write([]byte(`{"error":{"code":"FENCED_OUT","message":"stale","retryable":true}}`))
		default:
			w.WriteHeader(http.StatusBadGateway)
			_, _ = w.Write([]byte("  <html>proxy</html>\n"))
		}
	}))
	defer srv.Close()
	c, err := NewConn("test client", srv.URL, errInvalid, errUnavailable)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var out struct{ N int }
	if r, err := c.Call(ctx, "GET", "/ok", nil, nil, &out); r != nil || err != nil || out.N != 7 {
		t.Errorf("2xx: %+v %v %+v", r, err, out)
	}
	if r, err := c.Call(ctx, "GET", "/garbled", nil, nil, &out); r != nil || !errors.Is(err, errUnavailable) {
		t.Errorf("undecodable 2xx: %+v %v, want the unavailable sentinel", r, err)
	}
	r, err := c.Call(ctx, "GET", "/envelope", nil, nil, &out)
	if err != nil || r == nil || r.Status != http.StatusConflict || r.Code != "FENCED_OUT" || r.Message != "stale" || !r.Retryable || r.RetryAfter != 2*time.Second {
		t.Errorf("envelope: %+v %v", r, err)
	}
	r, err = c.Call(ctx, "GET", "/other", nil, nil, &out)
	if err != nil || r == nil || r.Status != http.StatusBadGateway || r.Code != "" || r.Message != "<html>proxy</html>" {
		t.Errorf("no envelope: %+v %v", r, err)
	}
	if r, err := c.Call(ctx, "GET", "/ok", nil, func() {}, &out); r != nil || !errors.Is(err, errInvalid) {
		t.Errorf("unencodable body: %+v %v, want the invalid sentinel", r, err)
	}
	dead, _ := NewConn("test client", "http://127.0.0.1:1", errInvalid, errUnavailable)
	if r, err := dead.Call(ctx, "GET", "/ok", nil, nil, &out); r != nil || !errors.Is(err, errUnavailable) || !errors.Is(err, ErrNoAnswer) {
		t.Errorf("no answer: %+v %v", r, err)
	}
	if _, err := NewConn("test client", srv.URL, errInvalid, errUnavailable, WithDoer(nil)); err == nil || !strings.HasPrefix(err.Error(), "test client: ") {
		t.Errorf("WithDoer(nil): %v", err)
	}
}

func TestMatches(t *testing.T) {
	errA, errU, other := errors.New("a"), errors.New("u"), errors.New("other")
	s := map[string]error{"A": errA}
	for _, c := range []struct {
		code   string
		status int
		target error
		want   bool
	}{
		{"A", 409, errA, true}, {"A", 409, errU, false}, {"A", 503, errU, false},
		{"", 502, errU, true}, {"", 404, errU, false}, {"B", 503, errU, false}, {"", 500, other, false},
	} {
		if got := Matches(s, c.code, c.status, c.target, errU); got != c.want {
			t.Errorf("Matches(%q, %d, %v) = %v", c.code, c.status, c.target, got)
		}
	}
}
