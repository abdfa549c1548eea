package lockserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// lateStore is a memstore that ends the request of owner "gone" right
// after a call grants it (cancelGone), and holds the first call that
// would end a lease of key held (a Release or Handoff from "gone", or any
// Revoke of it) until gate is closed; entered is closed when that call
// arrives.
type lateStore struct {
	*memstore.Store
	held string

	mu         sync.Mutex
	cancelGone context.CancelFunc
	// granted, when not nil, is closed once gone's Acquire has granted
	// it, and its request is ended only once answer is closed.
	granted, answer chan struct{}
	entered         chan struct{}
	gate            chan struct{}
	used            bool
}

func (s *lateStore) hold(key, owner string) {
	s.mu.Lock()
	wait := !s.used && key == s.held && (owner == "gone" || owner == "")
	if wait {
		s.used = true
		close(s.entered)
	}
	s.mu.Unlock()
	if wait {
		<-s.gate
	}
}

func (s *lateStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (store.Lease, error) {
	if owner != "gone" {
		return s.Store.Acquire(ctx, key, owner, ttl)
	}
	l, err := s.Store.Acquire(context.WithoutCancel(ctx), key, owner, ttl)
	if s.granted != nil {
		close(s.granted)
		<-s.answer
	}
	s.cancelGone()
	return l, err
}

func (s *lateStore) AcquireMany(ctx context.Context, reqs []store.AcquireRequest) []store.Result {
	res := s.Store.AcquireMany(ctx, reqs)
	for _, r := range reqs {
		if r.Owner == "gone" {
			s.cancelGone()
		}
	}
	return res
}

func (s *lateStore) Release(ctx context.Context, key, owner string, token int64) error {
	s.hold(key, owner)
	return s.Store.Release(ctx, key, owner, token)
}

func (s *lateStore) Handoff(ctx context.Context, from store.LeaseRef, to store.AcquireRequest) (store.Lease, error) {
	s.hold(from.Key, from.Owner)
	return s.Store.Handoff(ctx, from, to)
}

func (s *lateStore) Revoke(ctx context.Context, key string, token int64) (store.Lease, error) {
	s.hold(key, "")
	return s.Store.Revoke(ctx, key, token)
}

// TestALateReleaseOfAnAbandonedGrantEndsNothingNewer: an acquire's
// request ends just as the backend grants it (TTL 500 ms), and the
// background release of that abandoned grant is delayed in the store
// past the grant's expiry. Meanwhile a waiter, "next", is granted the key
// by its own ask once the abandoned lease has expired (answered 200, a
// newer token; it parks for one WaitPoll first, since a release of the
// key is in flight, so the stuck release delays it by that much only),
// and a second waiter parks behind it. When the late release
// finally reaches the store it must be refused (it is conditional on the
// abandoned grant's token): next's renewal and release succeed, the
// token is not repeated, and next's release reaches the second waiter at
// once.
func TestALateReleaseOfAnAbandonedGrantEndsNothingNewer(t *testing.T) {
	for _, c := range []struct {
		name              string
		batching, handoff bool
	}{{"single", false, false}, {"single-handoff", false, true}, {"batched", true, false}, {"batched-handoff", true, true}} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const key = "payout:acct-late"
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				s := &lateStore{Store: memstore.New(nil), held: key, cancelGone: cancel, entered: make(chan struct{}), gate: make(chan struct{})}
				h, _ := abandonServer(t, s, func(cfg *lockserver.ServerConfig) {
					cfg.Batching, cfg.Handoff, cfg.WaitPoll = c.batching, c.handoff, lockserver.MaxWaitPoll
				})
				if rec := <-send(h, waitAcquireTTL(ctx, key, "gone", api.MinTTLMs, 0)); rec.Code != api.StatusRequestCancelled {
					close(s.gate)
					t.Fatalf("gone: %d %s; want %d", rec.Code, rec.Body, api.StatusRequestCancelled)
				}
				synctest.Wait()
				select {
				case <-s.entered:
				default:
					t.Fatal("the abandoned grant's release never reached the store")
				}
				gone := liveLease(t, s, key)
				if gone == nil || gone.Owner != "gone" {
					close(s.gate)
					t.Fatalf("key %q: %+v; want gone's grant, its release held", key, gone)
				}
				next := send(h, waitAcquireTTL(t.Context(), key, "next", 60_000, api.MaxWaitMs))
				rec := <-next // granted at its first ask after gone's lease expired
				if rec.Code != http.StatusOK {
					close(s.gate)
					t.Fatalf("next: %d %s", rec.Code, rec.Body)
				}
				var g api.Grant
				if err := json.Unmarshal(rec.Body.Bytes(), &g); err != nil {
					t.Fatal(err)
				}
				if g.Token <= gone.Token {
					t.Fatalf("next's token %d, not above the abandoned grant's %d", g.Token, gone.Token)
				}
				second := send(h, waitAcquireTTL(t.Context(), key, "second", 60_000, api.MaxWaitMs))
				synctest.Wait()
				close(s.gate) // the late release goes on
				synctest.Wait()
				if l := liveLease(t, s, key); l == nil || l.Owner != "next" || l.Token != g.Token {
					t.Fatalf("key %q after the late release of token %d: %+v; want next's lease (token %d)", key, gone.Token, l, g.Token)
				}
				holderEndsAndWaiterIsWoken(t, h, key, "next", g.Token, "second", second)
				if err := h.Close(); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

// TestALateHandoffOfAnAbandonedGrantEndsNothingNewer: while the backend
// grants a plain acquire (TTL 500 ms) a waiter parks on the key; the
// acquire's request ends before its answer, and the release of the
// abandoned grant claims the parked waiter for a handoff, which the
// store holds past the grant's expiry. Meanwhile a plain acquire,
// "barger", is granted the key (a newer token). When the late handoff
// reaches the store it must be refused: the barger's lease is intact
// (renewal, release), the waiter is not granted on top of it, and the
// barger's release reaches the waiter at once, not after WaitPoll.
func TestALateHandoffOfAnAbandonedGrantEndsNothingNewer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const key = "payout:acct-late-handoff"
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		s := &lateStore{Store: memstore.New(nil), held: key, cancelGone: cancel, entered: make(chan struct{}), gate: make(chan struct{}),
			granted: make(chan struct{}), answer: make(chan struct{})}
		h, _ := abandonServer(t, s, func(cfg *lockserver.ServerConfig) {
			cfg.Batching, cfg.Handoff, cfg.WaitPoll = false, true, lockserver.MaxWaitPoll
		})
		gone := send(h, waitAcquireTTL(ctx, key, "gone", api.MinTTLMs, 0))
		<-s.granted
		waiter := send(h, waitAcquireTTL(t.Context(), key, "waiter", 60_000, api.MaxWaitMs))
		synctest.Wait()
		if !h.HeadParked(key) {
			close(s.answer)
			close(s.gate)
			t.Fatal("the waiter is not parked behind the grant in flight")
		}
		close(s.answer)
		if rec := <-gone; rec.Code != api.StatusRequestCancelled {
			close(s.gate)
			t.Fatalf("gone: %d %s; want %d", rec.Code, rec.Body, api.StatusRequestCancelled)
		}
		synctest.Wait()
		select {
		case <-s.entered:
		default:
			t.Fatal("the abandoned grant's release never reached the store")
		}
		abandoned := liveLease(t, s, key)
		time.Sleep(time.Until(abandoned.ExpiresAt) + time.Millisecond)
		rec := <-send(h, waitAcquireTTL(t.Context(), key, "barger", 60_000, 0))
		if rec.Code != http.StatusOK {
			close(s.gate)
			t.Fatalf("barger, after the abandoned grant expired: %d %s", rec.Code, rec.Body)
		}
		var g api.Grant
		if err := json.Unmarshal(rec.Body.Bytes(), &g); err != nil {
			t.Fatal(err)
		}
		close(s.gate) // the late handoff goes on
		synctest.Wait()
		if l := liveLease(t, s, key); l == nil || l.Owner != "barger" || l.Token != g.Token {
			t.Fatalf("key %q after the late handoff from token %d: %+v; want barger's lease (token %d)", key, abandoned.Token, l, g.Token)
		}
		if got := testutil.ToFloat64(h.HandoffCounter().WithLabelValues("refused")); got != 1 {
			t.Fatalf("handoffs refused: %v; want 1 (the late one)", got)
		}
		w := holderEndsAndWaiterIsWoken(t, h, key, "barger", g.Token, "waiter", waiter)
		if w.Token <= g.Token {
			t.Fatalf("waiter's token %d not above barger's %d", w.Token, g.Token)
		}
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// holderEndsAndWaiterIsWoken has holder renew and release its lease
// (token) of key, both of which must succeed, then takes the waiter's
// answer from answer: a grant, made well before MaxWaitPoll (woken by the
// release, not found by a poll). It returns the waiter's grant.
func holderEndsAndWaiterIsWoken(t *testing.T, h http.Handler, key, holder string, token int64, waiter string, answer <-chan *httptest.ResponseRecorder) api.Grant {
	t.Helper()
	if rec := schedPost(t.Context(), h, key, api.SuffixRenew, api.RenewRequest{Owner: holder, Token: token}); rec.Code != http.StatusOK {
		t.Fatalf("%s renewing: %d %s; want 200", holder, rec.Code, rec.Body)
	}
	start := time.Now()
	if rec := schedPost(t.Context(), h, key, api.SuffixRelease, api.ReleaseRequest{Owner: holder, Token: token}); rec.Code != http.StatusNoContent {
		t.Fatalf("%s releasing: %d %s; want 204", holder, rec.Code, rec.Body)
	}
	rec := <-answer
	if rec.Code != http.StatusOK {
		t.Fatalf("%s: %d %s", waiter, rec.Code, rec.Body)
	}
	if waited := time.Since(start); waited >= lockserver.MaxWaitPoll {
		t.Fatalf("%s granted %v after %s's release: not woken", waiter, waited, holder)
	}
	var g api.Grant
	if err := json.Unmarshal(rec.Body.Bytes(), &g); err != nil {
		t.Fatal(err)
	}
	return g
}
