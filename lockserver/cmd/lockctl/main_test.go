package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

func runCmd(t *testing.T, server string, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	root := newRoot(&out)
	root.SetArgs(append([]string{"--server", server}, args...))
	err := root.Execute()
	return out.String(), err
}

func TestOperatorFlow(t *testing.T) {
	h, err := lockserver.NewServer(memstore.New(nil), lockserver.DefaultServerConfig(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	out, err := runCmd(t, srv.URL, "acquire", "payout:acct-7", "--owner", "worker-a", "--ttl", "60s")
	if err != nil {
		t.Fatal(err)
	}
	var g api.Grant
	if err := json.Unmarshal([]byte(out), &g); err != nil || g.Owner != "worker-a" || g.Token <= 0 {
		t.Fatalf("acquire printed %s (%v)", out, err)
	}
	if _, err := runCmd(t, srv.URL, "acquire", "payout:acct-7"); !errors.Is(err, client.ErrLockHeld) {
		t.Fatalf("second acquire: %v; want LOCK_HELD", err)
	}
	if _, err := runCmd(t, srv.URL, "revoke", "payout:acct-7"); err == nil {
		t.Fatal("revoke without --reason accepted")
	}
	if _, err := runCmd(t, srv.URL, "revoke", "payout:acct-7", "--token", "999", "--reason", "test"); !errors.Is(err, client.ErrNotHeld) {
		t.Fatalf("revoke with a wrong token: %v; want LEASE_NOT_HELD", err)
	}
	if _, err := runCmd(t, srv.URL, "revoke", "payout:acct-7", "--reason", "stuck worker"); err != nil {
		t.Fatal(err)
	}
	out, err = runCmd(t, srv.URL, "inspect", "payout:acct-7")
	var st api.LockState
	if err != nil || json.Unmarshal([]byte(out), &st) != nil || st.Held || st.LastToken != g.Token {
		t.Fatalf("inspect after revoke: %s %v", out, err)
	}
	if _, err := runCmd(t, srv.URL, "inspect", "bad key"); !errors.Is(err, client.ErrInvalidRequest) {
		t.Fatalf("inspect of a bad key: %v", err)
	}
	out, err = runCmd(t, srv.URL, "acquire", "payout:acct-8", "--owner", "worker-b")
	if err != nil || json.Unmarshal([]byte(out), &g) != nil {
		t.Fatalf("acquire: %s %v", out, err)
	}
	if _, err := runCmd(t, srv.URL, "release", "payout:acct-8", "--owner", "worker-b"); err == nil || !strings.Contains(err.Error(), `required flag(s) "token"`) {
		t.Fatalf("release without --token: %v; want a missing-flag error", err)
	}
	if _, err := runCmd(t, srv.URL, "release", "payout:acct-8", "--owner", "worker-b", "--token", strconv.FormatInt(g.Token, 10)); err != nil {
		t.Fatalf("release: %v", err)
	}
	if _, err := runCmd(t, srv.URL, "ready"); err != nil {
		t.Fatal(err)
	}
}

// A lock-server that does not answer: the error names the URL tried and
// both ways to give another, and the port-forward URL it suggests for GKE
// is the port lock-server's pod serves.
func TestUnreachableServerNamesTheFlagAndTheVariable(t *testing.T) {
	srv := httptest.NewServer(nil)
	url := srv.URL
	srv.Close() // nothing listens there now
	_, err := runCmd(t, url, "inspect", "payout:acct-7")
	if err == nil {
		t.Fatal("inspect against a closed server succeeded")
	}
	msg := withHint(err, url).Error()
	for _, want := range []string{url, "--server", "LOCK_SERVER_URL", "nothing accepted the connection"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not name %s", msg, want)
		}
	}
	if strings.Contains(msg, "hung") {
		t.Errorf("a refused connection is called hung: %q", msg)
	}
	manifest, err := os.ReadFile("../../deploy/lock-server.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`containerPort: (\d+)`).FindSubmatch(manifest)
	if m == nil {
		t.Fatal("lockserver/deploy/lock-server.yaml declares no containerPort")
	}
	if want := "port-forward deploy/lock-server " + string(m[1]) + " makes it http://127.0.0.1:" + string(m[1]); !strings.Contains(msg, want) {
		t.Errorf("message %q does not say %q (the pod's containerPort)", msg, want)
	}
}

// A lock-server that accepts the request and answers nothing in time is
// hung at the right URL: the hint says so, and the liveness URL it names
// is one lock-server serves (200 once it answers again).
func TestHungServerHintNamesAServedURL(t *testing.T) {
	h, err := lockserver.NewServer(memstore.New(nil), lockserver.DefaultServerConfig(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	var hung atomic.Bool
	hung.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hung.Load() {
			<-r.Context().Done() // answers nothing until the caller gives up
			return
		}
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	_, err = runCmd(t, srv.URL, "ready", "--timeout", "1s")
	if err == nil {
		t.Fatal("ready against a hung server succeeded")
	}
	msg := withHint(err, srv.URL).Error()
	if !strings.Contains(msg, "hung") || strings.Contains(msg, "not its URL") {
		t.Errorf("message %q does not say lock-server is hung at the right URL", msg)
	}
	m := regexp.MustCompile(`its liveness is (\S+)`).FindStringSubmatch(msg)
	if m == nil {
		t.Fatalf("message %q names no liveness URL", msg)
	}
	if !strings.HasPrefix(m[1], srv.URL+"/") {
		t.Fatalf("liveness URL %s is not on the server tried (%s)", m[1], srv.URL)
	}
	hung.Store(false)
	resp, err := http.Get(m[1])
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET %s (the hint's URL) = %s; want 200", m[1], resp.Status)
	}
}

// A TTL out of bounds is refused before any request, in the flag's terms.
func TestAcquireRefusesABadTTLByItsFlag(t *testing.T) {
	for _, ttl := range []string{"-5s", "100ms", "11m", "1500us"} {
		_, err := runCmd(t, "http://127.0.0.1:1", "acquire", "payout:acct-7", "--ttl", ttl)
		if err == nil || !strings.Contains(err.Error(), "--ttl") || strings.Contains(err.Error(), "ttlMs") {
			t.Errorf("--ttl %s: %v; want a refusal naming --ttl", ttl, err)
		}
	}
}
