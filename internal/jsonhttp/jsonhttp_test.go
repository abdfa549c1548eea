package jsonhttp

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
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

func TestDoErrors(t *testing.T) {
	if _, _, err := Do(context.Background(), http.DefaultClient, "POST", "http://127.0.0.1:1/x", nil, func() {}); !errors.Is(err, ErrEncode) {
		t.Errorf("an unencodable body: %v; want ErrEncode", err)
	}
	srv := httptest.NewServer(nil)
	url := srv.URL
	srv.Close()
	if _, _, err := Do(context.Background(), http.DefaultClient, "GET", url+"/x", nil, nil); !errors.Is(err, ErrNoAnswer) {
		t.Errorf("a closed server: %v; want ErrNoAnswer", err)
	}
	if got := Excerpt([]byte("  " + strings.Repeat("x", 600) + " ")); len(got) != 512 {
		t.Errorf("Excerpt is %d bytes; want 512", len(got))
	}
}

// The clients that use this package promise their callers nothing but the
// standard library; so must it.
func TestImportsOnlyTheStandardLibrary(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	if deps := strings.Fields(string(out)); len(deps) != 1 {
		t.Errorf("internal/jsonhttp depends on %v; want the standard library only", deps)
	}
}
