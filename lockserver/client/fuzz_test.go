package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
)

// cannedServer answers every request with the status and body it was last
// given: a lock-server that says anything.
type cannedServer struct {
	mu     sync.Mutex
	status int
	body   []byte
}

func (c *cannedServer) set(status int, body []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.status, c.body = status, body
}

func (c *cannedServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	status, body := c.status, c.body
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// FuzzClientAnswers gives the SDK arbitrary answers (status 200..599, any
// body) to acquire, renew, release, inspect and revoke, and checks what it
// makes of them: a non-2xx answer is an *Error with that status (and the
// envelope's code, if any: the sentinels match on it alone); a success
// describes exactly the lock, owner and token asked about, never another
// (a lease on key A must never carry a grant of key B, whose token would
// then be presented to A's fence point).
func FuzzClientAnswers(f *testing.F) {
	grant := `{"key":"payout:acct-1","owner":"worker-a","token":7,"leaseId":"pg-7","ttlMs":60000,"expiresAt":"2026-12-01T10:00:00Z"}`
	for _, s := range []struct {
		op     uint8
		status int
		body   string
	}{
		{0, 200, grant},
		{1, 200, grant},
		{2, 204, ``},
		{3, 200, `{"key":"payout:acct-1","held":true,"lease":` + grant + `,"lastToken":7}`},
		{4, 200, grant},
		{0, 200, `{"key":"payout:acct-2","owner":"worker-a","token":7,"leaseId":"pg-7","ttlMs":60000,"expiresAt":"2026-12-01T10:00:00Z"}`},
		{0, 200, `{"key":"payout:acct-1","owner":"worker-a","token":0,"ttlMs":60000}`},
		{0, 200, `{"key":"payout:acct-1","owner":"worker-a","token":7,"ttlMs":-1}`},
		{0, 200, `{"key":"payout:acct-1","owner":"worker-a","token":7,"ttlMs":9223372036854775807}`},
		{1, 200, `{"key":"payout:acct-1","owner":"worker-a","token":8,"ttlMs":60000}`},
		{3, 200, `{"key":"payout:acct-9","held":false,"lastToken":7}`},
		{3, 200, `{"key":"payout:acct-1","held":true,"lastToken":7}`},
		{0, 200, `not json`},
		{0, 200, ``},
		{0, 409, `{"error":{"code":"LOCK_HELD","message":"held","retryable":true}}`},
		{1, 409, `{"error":{"code":"STALE_TOKEN","message":"newer grant","retryable":false}}`},
		{0, 503, `{"error":{"code":"BACKEND_UNAVAILABLE","message":"down","retryable":true}}`},
		{0, 502, `<html>bad gateway</html>`},
		{0, 409, `{"error":{"code":"","message":"no code"}}`},
		{2, 400, `{"error":{"code":"INVALID_REQUEST","message":"bad"}}`},
		{4, 404, `{"error":"flat"}`},
		{0, 299, grant},
	} {
		f.Add(s.op, s.status, []byte(s.body))
	}
	srv := &cannedServer{}
	ts := httptest.NewServer(srv)
	f.Cleanup(ts.Close)
	c, err := client.New(ts.URL, client.WithOwner("worker-a"), client.WithRequestTimeout(5*time.Second))
	if err != nil {
		f.Fatal(err)
	}
	const key, owner, token = "payout:acct-1", "worker-a", int64(7)
	f.Fuzz(func(t *testing.T, op uint8, status int, body []byte) {
		if status < 200 || status > 599 {
			status = 200 + (status%400+400)%400
		}
		srv.set(status, body)
		ctx := context.Background()
		var err error
		switch op % 5 {
		case 0:
			var l *client.Lease
			l, err = c.TryAcquire(ctx, key, client.WithTTL(time.Minute))
			if err == nil {
				if l.Key() != key || l.Owner() != owner || l.Token() <= 0 {
					t.Fatalf("TryAcquire(%q) = lease of %q, owner %q, token %d from %d %s", key, l.Key(), l.Owner(), l.Token(), status, body)
				}
				if d := time.Until(l.Deadline()); d > time.Duration(api.MaxTTLMs)*time.Millisecond {
					t.Fatalf("TryAcquire: a local deadline %v away, beyond the longest lease, from %d %s", d, status, body)
				}
				_ = l.Release(ctx)
			}
		case 1:
			var g api.Grant
			g, err = c.RenewLease(ctx, key, owner, token)
			if err == nil && (g.Key != key || g.Owner != owner || g.Token != token || g.TTLMs <= 0) {
				t.Fatalf("RenewLease(%q, %q, %d) = %+v from %d %s", key, owner, token, g, status, body)
			}
		case 2:
			err = c.ReleaseLease(ctx, key, owner, token)
		case 3:
			var st api.LockState
			st, err = c.Inspect(ctx, key)
			if err == nil && (st.Key != key || st.Held != (st.Lease != nil) || st.Lease != nil && (st.Lease.Key != key || st.Lease.Token <= 0)) {
				t.Fatalf("Inspect(%q) = %+v from %d %s", key, st, status, body)
			}
		case 4:
			var g api.Grant
			g, err = c.Revoke(ctx, key, token, "fuzz")
			if err == nil && (g.Key != key || g.Token != token) {
				t.Fatalf("Revoke(%q, %d) = %+v from %d %s", key, token, g, status, body)
			}
		}
		if status/100 == 2 {
			return
		}
		var e *client.Error
		if !errors.As(err, &e) || e.Status != status {
			t.Fatalf("answer %d %s gave %v; want an *client.Error with status %d", status, body, err, status)
		}
		if errors.Is(err, client.ErrLockHeld) != (e.Code == api.CodeLockHeld) || errors.Is(err, client.ErrStaleToken) != (e.Code == api.CodeStaleToken) {
			t.Fatalf("answer %d %s: sentinels do not follow the code %q: %v", status, body, e.Code, err)
		}
	})
}

// A renewal answered with a grant of another token loses the Lease: the
// SDK cannot know what the server extended, so it stops trusting it.
func TestRenewalOfAnotherTokenLosesTheLease(t *testing.T) {
	srv := &cannedServer{}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	c, err := client.New(ts.URL, client.WithOwner("worker-a"))
	if err != nil {
		t.Fatal(err)
	}
	srv.set(200, []byte(`{"key":"payout:acct-1","owner":"worker-a","token":7,"leaseId":"pg-7","ttlMs":60000}`))
	l, err := c.TryAcquire(context.Background(), "payout:acct-1", client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	srv.set(200, []byte(`{"key":"payout:acct-1","owner":"worker-a","token":8,"leaseId":"pg-8","ttlMs":60000}`))
	if err := l.Renew(context.Background()); !errors.Is(err, client.ErrLeaseLost) || !errors.Is(err, client.ErrBadAnswer) {
		t.Fatalf("Renew answered with token 8 for token 7: %v; want ErrLeaseLost wrapping ErrBadAnswer", err)
	}
	if l.Held() {
		t.Fatal("the lease is still reported held")
	}
	srv.set(204, nil)
	_ = l.Release(context.Background())
}
