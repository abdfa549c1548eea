package link_test

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/local/link"
)

// upstream is an HTTP server that counts the requests it acted on.
func upstream(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var acted atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		acted.Add(1)
		io.WriteString(w, strings.Repeat("x", 100))
	}))
	t.Cleanup(srv.Close)
	return srv, &acted
}

func open(t *testing.T, srv *httptest.Server) *link.Link {
	l, err := link.Open(slog.New(slog.DiscardHandler), "test->upstream", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

// get posts through the link with a fresh connection and a timeout.
func get(l *link.Link, timeout time.Duration) (time.Duration, error) {
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
	t0 := time.Now()
	resp, err := c.Post("http://"+l.Addr()+"/", "text/plain", strings.NewReader("pay"))
	if err != nil {
		return time.Since(t0), err
	}
	defer resp.Body.Close()
	_, err = io.ReadAll(resp.Body)
	return time.Since(t0), err
}

func TestAnswerLostAfterTheUpstreamActed(t *testing.T) {
	srv, acted := upstream(t)
	l := open(t, srv)
	if err := l.Inject(link.Fault{Kind: link.ResetAfter, Bytes: 0}); err != nil {
		t.Fatal(err)
	}
	if _, err := get(l, 5*time.Second); err == nil {
		t.Fatal("request through a reset-after-0 link: got an answer, want none")
	}
	if got := acted.Load(); got != 1 {
		t.Fatalf("upstream acted %d times, want 1: the request must reach it, only the answer is lost", got)
	}
	if err := l.Heal(); err != nil {
		t.Fatal(err)
	}
	if _, err := get(l, 5*time.Second); err != nil {
		t.Fatalf("after Heal: %v", err)
	}
}

func TestTimeoutPassesNothing(t *testing.T) {
	srv, acted := upstream(t)
	l := open(t, srv)
	if err := l.Inject(link.Fault{Kind: link.Timeout}); err != nil {
		t.Fatal(err)
	}
	_, err := get(l, 300*time.Millisecond)
	var ne interface{ Timeout() bool }
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("request through a timeout link: got %v, want a client timeout", err)
	}
	if got := acted.Load(); got != 0 {
		t.Fatalf("upstream acted %d times behind a timeout link, want 0", got)
	}
}

func TestCutRefusesAndHealListensAgain(t *testing.T) {
	srv, _ := upstream(t)
	l := open(t, srv)
	addr := l.Addr()
	if err := l.Inject(link.Fault{Kind: link.Cut}); err != nil {
		t.Fatal(err)
	}
	if _, err := get(l, 2*time.Second); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("request through a cut link: got %v, want connection refused", err)
	}
	if err := l.Heal(); err != nil {
		t.Fatal(err)
	}
	if l.Addr() != addr {
		t.Fatalf("healed link listens on %s, want %s (its clients dial that)", l.Addr(), addr)
	}
	if _, err := get(l, 5*time.Second); err != nil {
		t.Fatalf("after Heal: %v", err)
	}
}

func TestLatencyDelaysTheAnswer(t *testing.T) {
	srv, _ := upstream(t)
	l := open(t, srv)
	if err := l.Inject(link.Fault{Kind: link.Latency, Latency: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	took, err := get(l, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if took < 300*time.Millisecond {
		t.Fatalf("answer through a 300 ms link came after %v, want >= 300 ms", took)
	}
}

func TestBandwidthAndInvalidFaults(t *testing.T) {
	srv, _ := upstream(t)
	l := open(t, srv)
	if err := l.Inject(link.Fault{Kind: link.Bandwidth, RateKBps: 1}); err != nil {
		t.Fatal(err)
	}
	if f, ok := l.Fault(); !ok || f.Kind != link.Bandwidth {
		t.Fatalf("fault in force: got %v %v, want bandwidth", f, ok)
	}
	if _, err := get(l, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, f := range []link.Fault{{Kind: "flood"}, {Kind: link.Bandwidth}, {Kind: link.Latency, Latency: time.Millisecond, Jitter: time.Second}, {Kind: link.ResetAfter, Bytes: -1}} {
		if err := l.Inject(f); !errors.Is(err, link.ErrInvalidFault) {
			t.Errorf("Inject(%+v): got %v, want ErrInvalidFault", f, err)
		}
	}
	l.Close()
	if err := l.Heal(); !errors.Is(err, link.ErrClosed) {
		t.Fatalf("Heal after Close: got %v, want ErrClosed", err)
	}
}
