package lockserver_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// slowReleaseStore is a memstore whose Release and Handoff of one key
// take hold (in the synctest bubble's time) before they are served.
type slowReleaseStore struct {
	*memstore.Store
	key  string
	hold time.Duration
}

func (s *slowReleaseStore) Release(ctx context.Context, key, owner string, token int64) error {
	if key == s.key {
		time.Sleep(s.hold)
	}
	return s.Store.Release(ctx, key, owner, token)
}

func (s *slowReleaseStore) Handoff(ctx context.Context, from store.LeaseRef, to store.AcquireRequest) (store.Lease, error) {
	if from.Key == s.key {
		time.Sleep(s.hold)
	}
	return s.Store.Handoff(ctx, from, to)
}

// TestOverlappingReleasesDelayTheHeadByWaitPollAtMost: a free key whose
// releases (stale ones, refused) overlap without end through this
// lock-server, each slower than WaitPoll. A waiting acquire of the key
// parks while one is in flight, but, as for a release that hangs, asks
// anyway once WaitPoll has passed: it is granted within WaitPoll (plus
// one release, when the handoff of one has claimed it then), and is not
// answered LOCK_HELD at the end of its wait for a key nobody held.
func TestOverlappingReleasesDelayTheHeadByWaitPollAtMost(t *testing.T) {
	withAndWithoutHandoff(t, func(t *testing.T, handoff bool) {
		const key = "payout:acct-overlapping-releases"
		const poll, hold, every = 250 * time.Millisecond, 310 * time.Millisecond, 70 * time.Millisecond
		s := &slowReleaseStore{Store: memstore.New(nil), key: key, hold: hold}
		h, _ := abandonServer(t, s, func(cfg *lockserver.ServerConfig) {
			cfg.Batching, cfg.Handoff, cfg.WaitPoll = false, handoff, poll
		})
		// A zombie's release with a token nobody holds, sent every 70ms
		// for 2.8s: at least four are always in flight.
		ctx, stop := context.WithCancel(t.Context())
		zombies := make(chan []*httptest.ResponseRecorder, 1)
		go func() {
			var answers []<-chan *httptest.ResponseRecorder
			for ctx.Err() == nil && len(answers) < 40 {
				answers = append(answers, send(h, lockRequest(t.Context(), key, api.SuffixRelease, api.ReleaseRequest{Owner: "zombie", Token: 1})))
				time.Sleep(every)
			}
			var recs []*httptest.ResponseRecorder
			for _, a := range answers {
				recs = append(recs, <-a)
			}
			zombies <- recs
		}()
		time.Sleep(hold + every/2) // releases end every 70ms from now on
		start := time.Now()
		rec := <-send(h, waitAcquireTTL(t.Context(), key, "waiter", 30_000, 2_000))
		waited := time.Since(start)
		stop()
		for _, z := range <-zombies {
			if z.Code != http.StatusConflict {
				t.Errorf("zombie's release: %d %s; want 409", z.Code, z.Body)
			}
		}
		if rec.Code != http.StatusOK || waited > poll+hold {
			t.Fatalf("waiter of a free key while releases of it overlap here: %d %s after %v; want 200 within WaitPoll and one release (%v)", rec.Code, rec.Body, waited, poll+hold)
		}
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestHungReleaseLeavesTheHeadAskingEveryWaitPoll: the holder's release
// hangs in the backend. A waiting acquire of the key parks for it, but
// asks once WaitPoll has passed, and again WaitPoll after each ask (the
// key is still held: each ask is refused), and its wait ends on time.
func TestHungReleaseLeavesTheHeadAskingEveryWaitPoll(t *testing.T) {
	withAndWithoutHandoff(t, func(t *testing.T, handoff bool) {
		const key = "payout:acct-hung-release"
		const poll, wait = 250 * time.Millisecond, 1000 * time.Millisecond
		s := &releaseGateStore{Store: memstore.New(nil)}
		h, _ := abandonServer(t, s, func(cfg *lockserver.ServerConfig) {
			cfg.Batching, cfg.Handoff, cfg.WaitPoll = false, handoff, poll
		})
		holder := acquired(t, h, key, "holder")
		entered, gate := s.holdRelease(key)
		released := send(h, lockRequest(t.Context(), key, api.SuffixRelease, api.ReleaseRequest{Owner: "holder", Token: holder.Token}))
		<-entered
		start := time.Now()
		rec := <-send(h, waitAcquireTTL(t.Context(), key, "waiter", 30_000, wait.Milliseconds()))
		waited, asks := time.Since(start), s.asked("waiter")
		close(gate)
		<-released
		if rec.Code != http.StatusConflict || waited != wait {
			t.Fatalf("waiter during a hung release: %d %s after %v; want 409 after its wait (%v)", rec.Code, rec.Body, waited, wait)
		}
		if want := int(wait/poll) - 1; asks < want {
			t.Fatalf("waiter during a hung release asked %d times in %v; want at least %d (WaitPoll %v)", asks, wait, want, poll)
		}
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
	})
}
