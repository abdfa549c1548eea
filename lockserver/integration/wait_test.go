package integration_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
)

// TestWaitedGrantCountsTheWaitAndStaysBeforeExpiry: a grant that waited
// about 2 s in lock-server's queue (for the holder's lease to expire) gets
// a deadline that counts the wait, and still before the server's expiry
// (INV-06).
func TestWaitedGrantCountsTheWaitAndStaysBeforeExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, _, c := newStack(t)
		const key = "payout:acct-9"
		if _, err := store.Acquire(t.Context(), key, "worker-b", 2*time.Second); err != nil {
			t.Fatal(err)
		}
		sent := time.Now()
		l, err := c.TryAcquire(t.Context(), key, client.WithTTL(2*time.Second), client.WithWait(5*time.Second))
		if err != nil {
			t.Fatalf("TryAcquire with a wait: %v", err)
		}
		defer l.Release(t.Context())
		if w := l.Grant().WaitedMs; w < 2000 {
			t.Fatalf("waitedMs = %d, want the holder's remaining 2000 ms or more", w)
		}
		if expiry := serverExpiry(t, store, key); !l.Deadline().Before(expiry) {
			t.Fatalf("Deadline sent+%v is not before the server's expiry sent+%v", l.Deadline().Sub(sent), expiry.Sub(sent))
		}
		if got := l.Deadline().Sub(sent); got < 2*time.Second {
			t.Fatalf("Deadline = sent+%v: the 2 s spent waiting were not counted, the lease is nearly useless", got)
		}
	})
}

// inflating reports every grant's waitedMs as 50 s: a broken server.
type inflating struct{ next client.Doer }

func (d inflating) Do(r *http.Request) (*http.Response, error) {
	resp, err := d.next.Do(r)
	if err != nil || resp.StatusCode != http.StatusOK {
		return resp, err
	}
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if json.Unmarshal(raw, &m) == nil {
		if _, ok := m["token"]; ok {
			m["waitedMs"] = 50_000
			raw, _ = json.Marshal(m)
		}
	}
	resp.Body = io.NopCloser(bytes.NewReader(raw))
	return resp, nil
}

// TestInflatedWaitCannotPushTheDeadlinePastExpiry: the SDK never counts
// more waiting than the round trip it measured itself.
func TestInflatedWaitCannotPushTheDeadlinePastExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, w, _ := newStack(t)
		c, err := client.New("http://lock-server.test", client.WithHTTPClient(inflating{w}), client.WithOwner("worker-a"))
		if err != nil {
			t.Fatal(err)
		}
		const key = "payout:acct-10"
		if _, err := store.Acquire(t.Context(), key, "worker-b", time.Second); err != nil {
			t.Fatal(err)
		}
		l, err := c.TryAcquire(t.Context(), key, client.WithTTL(2*time.Second), client.WithWait(5*time.Second))
		if err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		if expiry := serverExpiry(t, store, key); !l.Deadline().Before(expiry) {
			t.Fatalf("Deadline %v is not before the server's expiry %v: the server's waitedMs was trusted", l.Deadline(), expiry)
		}
	})
}

// TestWaitRunsOutWithLockHeld: TryAcquire with a wait answers LOCK_HELD
// once the wait is over, and Acquire asks again at once until ctx ends.
func TestWaitRunsOutWithLockHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, w, c := newStack(t)
		const key = "payout:acct-11"
		if _, err := store.Acquire(t.Context(), key, "worker-b", 60*time.Second); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if _, err := c.TryAcquire(t.Context(), key, client.WithWait(time.Second)); !errors.Is(err, client.ErrLockHeld) {
			t.Fatalf("TryAcquire = %v, want ErrLockHeld", err)
		}
		if waited := time.Since(start); waited < time.Second {
			t.Fatalf("answered after %v, want the whole 1 s wait", waited)
		}
		timed := &timingDoer{next: w}
		c2, err := client.New("http://lock-server.test", client.WithHTTPClient(timed), client.WithOwner("worker-a"))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 3500*time.Millisecond)
		defer cancel()
		if _, err := c2.Acquire(ctx, key, client.WithWait(time.Second)); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire = %v, want the context's deadline", err)
		}
		// Three whole long-polls, one after the other; then lock-server
		// answers at once as the caller's budget runs out.
		if got := timed.took[:min(3, len(timed.took))]; len(got) != 3 || got[0] != time.Second || got[1] != time.Second || got[2] != time.Second {
			t.Fatalf("requests took %v; want three long-polls of 1s first", timed.took)
		}
	})
}

// timingDoer records how long each request took (one caller at a time).
type timingDoer struct {
	next client.Doer
	took []time.Duration
}

func (d *timingDoer) Do(r *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := d.next.Do(r)
	d.took = append(d.took, time.Since(start))
	return resp, err
}
