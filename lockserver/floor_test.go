package lockserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// rewoundStore is a memstore whose token counter an in-place restore has
// taken back: every token it mints is lowered by back.
type rewoundStore struct {
	*memstore.Store
	back     int64
	handBack atomic.Int64 // what Handoff lowers its tokens by
	revoked  []int64
}

func (s *rewoundStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (store.Lease, error) {
	l, err := s.Store.Acquire(ctx, key, owner, ttl)
	l.Token -= s.back
	return l, err
}

func (s *rewoundStore) Revoke(ctx context.Context, key string, token int64) (store.Lease, error) {
	s.revoked = append(s.revoked, token)
	return s.Store.Revoke(ctx, key, token+s.back)
}

// TestServerWithdrawsATokenNotAboveOneItIssued: after the backend's counter
// goes back (a restore that keeps every identity fact), the next grant
// would repeat a token this lock-server already handed out. The server
// must withdraw it and answer 503 BACKEND_RESTORED, publish the largest
// token it issued, and grant again once the backend's tokens are above it.
func TestServerWithdrawsATokenNotAboveOneItIssued(t *testing.T) {
	store := &rewoundStore{Store: memstore.New(nil)}
	cfg := lockserver.DefaultServerConfig()
	cfg.Registry = prometheus.NewRegistry()
	h := serverWith(t, store, cfg)
	acquire := func(key string) (int, api.Grant, api.ErrorEnvelope) {
		rec := do(h, "POST", "/v1/locks/"+key+"/acquire", "application/json", `{"owner":"worker-a","ttlMs":60000}`)
		var g api.Grant
		var e api.ErrorEnvelope
		if rec.Code == 200 {
			_ = json.Unmarshal(rec.Body.Bytes(), &g)
		} else {
			_ = json.Unmarshal(rec.Body.Bytes(), &e)
		}
		return rec.Code, g, e
	}
	var last int64
	for _, key := range []string{"payout:a", "payout:b", "payout:c"} {
		code, g, _ := acquire(key)
		if code != 200 {
			t.Fatalf("acquire %s before the restore: %d", key, code)
		}
		last = g.Token
	}
	if got := gauge(t, cfg.Registry, "lockserver_highest_token_issued"); got != float64(last) {
		t.Fatalf("lockserver_highest_token_issued = %v, want %d", got, last)
	}

	store.back = 2 // the backend now mints last-1 next: a repeat
	code, _, e := acquire("payout:d")
	if code != 503 || e.Error.Code != api.CodeBackendRestored || e.Error.Retryable {
		t.Fatalf("acquire after the rewind: %d %+v; want 503 BACKEND_RESTORED, not retryable", code, e)
	}
	if len(store.revoked) != 1 || store.revoked[0] != last-1 {
		t.Fatalf("withdrawn tokens %v, want [%d]", store.revoked, last-1)
	}
	if st, _ := store.Inspect(context.Background(), "payout:d"); st.Lease != nil {
		t.Fatalf("the refused grant is still live: %+v", st.Lease)
	}
	code, _, _ = acquire("payout:d") // mints last: still a repeat
	if code != 503 {
		t.Fatalf("second acquire after the rewind: %d, want 503", code)
	}
	code, g, _ := acquire("payout:d") // mints last+1
	if code != 200 || g.Token <= last {
		t.Fatalf("acquire once the backend is past the floor: %d token %d, want 200 above %d", code, g.Token, last)
	}
}

// gauge returns the value of the label-free gauge name in reg.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

// Handoff is the memstore's, with the token lowered by handBack.
func (s *rewoundStore) Handoff(ctx context.Context, from store.LeaseRef, to store.AcquireRequest) (store.Lease, error) {
	l, err := s.Store.Handoff(ctx, from, to)
	l.Token -= s.handBack.Load()
	return l, err
}

// TestServerWithdrawsAHandoffNotAboveItsFloor: a release hands the key to
// a parked waiter, but the backend's counter has gone back, so the
// handoff's token is not above one this lock-server issued. The grant is
// withdrawn before the waiter hears of it; the release (which did take
// effect) is answered 204; the waiter asks again and is granted above the
// floor.
func TestServerWithdrawsAHandoffNotAboveItsFloor(t *testing.T) {
	store := &rewoundStore{Store: memstore.New(nil)}
	cfg := lockserver.DefaultServerConfig()
	cfg.Batching = false
	h := serverWith(t, store, cfg)
	const key = "payout:acct-floor"
	_, holder := serve(h, waitAcquire(t.Context(), key, "holder", 0))
	answer := waitFor(context.Background(), h, key, "waiter")
	awaitParked(t, h, key)
	store.handBack.Store(2) // the handoff mints holder.Token-1: a repeat
	releaseGrant(t, h, holder)
	a := <-answer
	if a.status != http.StatusOK || a.grant.Token <= holder.Token {
		t.Fatalf("waiter: %d token %d; want granted above the floor %d", a.status, a.grant.Token, holder.Token)
	}
	if !slices.Equal(store.revoked, []int64{holder.Token - 1}) {
		t.Fatalf("withdrawn tokens %v, want [%d] (the handoff's)", store.revoked, holder.Token-1)
	}
}
