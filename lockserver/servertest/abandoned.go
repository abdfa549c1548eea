package servertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/storetest"
)

// AbandonedGrants runs lock-server (lockserver.Server, with and without
// batching, handoff on) over stores of b while acquires end at seeded
// random points, some just after the backend granted them, so that
// lock-server releases those abandoned grants in the background
// (lockserver/abandon.go). It checks, on the real backend, what the
// Server promises whatever the order:
//
//   - a client answered 200 is its key's only holder, its token above the
//     key's earlier 200s, and its renewal and release succeed: no
//     background release ended its lease;
//   - a request ended right after its grant is never answered 200;
//   - every waiter whose request did not end is granted, before WaitPoll
//     could have found the key (every release woke the key's waiters);
//   - after Server.Close, which returns nil, every key is free although
//     every grant had a minute of TTL: no abandoned grant was left to it.
//
// The store needs store.BatchStore, BatchRenewer and Handoffer
// (pgstore and etcdstore have them); it is skipped otherwise. Real time:
// each schedule takes well under a second on loopback. With b.Half set
// it runs every other schedule (storetest.Backend.Half).
func AbandonedGrants(t *testing.T, b storetest.Backend) {
	const seeds = 5
	for i, batching := range []bool{false, true} {
		t.Run(fmt.Sprintf("batching=%v", batching), func(t *testing.T) {
			for seed := range uint64(seeds) {
				t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
					b.SkipOtherHalf(t, i*seeds+int(seed)+1)
					abandonedSchedule(t, b, batching, seed)
				})
			}
		})
	}
}

// endingStore wraps a store and ends a chosen owner's request (cancel)
// just after a call granted it the key.
type endingStore struct {
	store.LockStore
	mu     sync.Mutex
	cancel map[string]context.CancelFunc
}

func (s *endingStore) ended(owner string) {
	s.mu.Lock()
	c := s.cancel[owner]
	s.mu.Unlock()
	if c != nil {
		c()
	}
}

func (s *endingStore) endsAfterGrant(owner string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cancel[owner] != nil
}

func (s *endingStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (store.Lease, error) {
	if s.endsAfterGrant(owner) {
		// The backend's answer comes back whatever the request does.
		ctx = context.WithoutCancel(ctx)
	}
	l, err := s.LockStore.Acquire(ctx, key, owner, ttl)
	if err == nil {
		s.ended(owner)
	}
	return l, err
}

func (s *endingStore) AcquireMany(ctx context.Context, reqs []store.AcquireRequest) []store.Result {
	res := s.LockStore.(store.BatchStore).AcquireMany(ctx, reqs)
	for i, r := range res {
		if r.Err == nil {
			s.ended(reqs[i].Owner)
		}
	}
	return res
}

func (s *endingStore) ReleaseMany(ctx context.Context, refs []store.LeaseRef) []error {
	return s.LockStore.(store.BatchStore).ReleaseMany(ctx, refs)
}

func (s *endingStore) RenewMany(ctx context.Context, refs []store.LeaseRef) []store.Result {
	return s.LockStore.(store.BatchRenewer).RenewMany(ctx, refs)
}

func (s *endingStore) Handoff(ctx context.Context, from store.LeaseRef, to store.AcquireRequest) (store.Lease, error) {
	l, err := s.LockStore.(store.Handoffer).Handoff(ctx, from, to)
	if err == nil {
		s.ended(to.Owner)
	}
	return l, err
}

func post(ctx context.Context, h http.Handler, key, op string, body any) *httptest.ResponseRecorder {
	raw, _ := json.Marshal(body)
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, api.PathLockPrefix+key+op, bytes.NewReader(raw))
	r.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

func abandonedSchedule(t *testing.T, b storetest.Backend, batching bool, seed uint64) {
	inner := b.Open(t)
	t.Cleanup(func() { _ = inner.Close() })
	_, bs := inner.(store.BatchStore)
	_, br := inner.(store.BatchRenewer)
	_, ho := inner.(store.Handoffer)
	if !bs || !br || !ho {
		t.Skipf("%s: the store lacks batches or handoffs", b.Name)
	}
	store := &endingStore{LockStore: inner, cancel: map[string]context.CancelFunc{}}
	cfg := lockserver.DefaultServerConfig()
	cfg.Batching, cfg.Handoff, cfg.WaitPoll = batching, true, lockserver.MaxWaitPoll
	h, err := lockserver.NewServer(store, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	const (
		clients  = 24
		never    = 0
		inStore  = 1
		atRandom = 2
	)
	keys := []string{"payout:acct-ab-0", "payout:acct-ab-1", "payout:acct-ab-2"}
	r := rand.New(rand.NewPCG(seed, 0xab))
	var (
		mu    sync.Mutex
		now   = map[string]string{}
		last  = map[string]int64{}
		wg    sync.WaitGroup
		start = time.Now()
	)
	for i := range clients {
		owner := fmt.Sprintf("ab%02d", i)
		key := keys[r.IntN(len(keys))]
		end := r.IntN(3)
		var waitMs int64
		if r.IntN(3) > 0 {
			waitMs = 30_000
		}
		if end == atRandom && waitMs == 0 {
			// A plain acquire's backend call runs on its request's
			// context: cut at random, its outcome is unknown and a grant
			// it made is an orphan until its TTL, by design. A waiter's
			// asks are detached from its request.
			end = never
		}
		begin := time.Duration(r.IntN(30)) * time.Millisecond
		cancelAt := time.Duration(r.IntN(30)) * time.Millisecond
		hold := time.Duration(r.IntN(10)) * time.Millisecond
		ctx, cancel := context.WithCancel(t.Context())
		switch end {
		case inStore:
			store.mu.Lock()
			store.cancel[owner] = cancel
			store.mu.Unlock()
		case atRandom:
			time.AfterFunc(begin+cancelAt, cancel)
		}
		wg.Go(func() {
			defer cancel()
			time.Sleep(begin)
			rec := post(ctx, h, key, api.SuffixAcquire, api.AcquireRequest{Owner: owner, TTLMs: 60_000, WaitMs: waitMs})
			switch {
			case rec.Code == http.StatusOK:
			case end == never && waitMs > 0:
				t.Errorf("%s, a waiter whose request never ended: %d %s; want granted", owner, rec.Code, rec.Body)
				return
			case end == never && rec.Code != http.StatusConflict:
				t.Errorf("%s, a plain acquire whose request never ended: %d %s; want 200 or 409", owner, rec.Code, rec.Body)
				return
			default:
				return
			}
			if end == inStore {
				t.Errorf("%s answered its grant although its request ended right after the backend granted it: %s", owner, rec.Body)
			}
			var g api.Grant
			if err := json.Unmarshal(rec.Body.Bytes(), &g); err != nil {
				t.Errorf("%s: %v", owner, err)
				return
			}
			mu.Lock()
			if other, ok := now[key]; ok {
				t.Errorf("%s told 200 for %q (token %d) while %s holds it", owner, key, g.Token, other)
			}
			if g.Token <= last[key] {
				t.Errorf("%s told 200 for %q with token %d, not above the previous 200's %d", owner, key, g.Token, last[key])
			}
			now[key], last[key] = owner, g.Token
			mu.Unlock()
			time.Sleep(hold / 2)
			if rec := post(t.Context(), h, key, api.SuffixRenew, api.RenewRequest{Owner: owner, Token: g.Token}); rec.Code != http.StatusOK {
				t.Errorf("%s renewing (token %d): %d %s; want 200: its lease was ended under it", owner, g.Token, rec.Code, rec.Body)
			}
			time.Sleep(hold / 2)
			mu.Lock()
			delete(now, key)
			mu.Unlock()
			if rec := post(t.Context(), h, key, api.SuffixRelease, api.ReleaseRequest{Owner: owner, Token: g.Token}); rec.Code != http.StatusNoContent {
				t.Errorf("%s releasing (token %d): %d %s; want 204: its lease was ended under it", owner, g.Token, rec.Code, rec.Body)
			}
		})
	}
	wg.Wait()
	if took := time.Since(start); took >= cfg.WaitPoll {
		t.Errorf("the schedule took %v: a waiter was left to WaitPoll (%v), not woken by a release", took, cfg.WaitPoll)
	}
	if err := h.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, k := range keys {
		st, err := inner.Inspect(t.Context(), k)
		if err != nil {
			t.Fatal(err)
		}
		if st.Lease != nil {
			t.Errorf("key %q still held by %+v after every client released or left: a grant left to its TTL", k, *st.Lease)
		}
	}
}
