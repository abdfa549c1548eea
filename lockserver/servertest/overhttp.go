package servertest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/storetest"
)

// OverHTTP wraps b so that the suite reaches the store through a real
// lock-server HTTP handler (on a loopback httptest server) and the Go SDK:
// acquire goes through Client.TryAcquire, renew and release through the
// SDK's wire-level calls, and every SDK error is mapped back to the
// LockStore sentinel of the same meaning. Reopen restarts the lock-server
// in front of a reopened store.
func OverHTTP(b storetest.Backend) storetest.Backend {
	wrapped := b
	wrapped.Name = b.Name + "/http+sdk"
	wrapped.Open = func(t *testing.T) store.LockStore { return serve(t, b.Open(t)) }
	wrapped.Reopen = func(t *testing.T, s store.LockStore) store.LockStore {
		hs := s.(*httpStore)
		hs.srv.Close()
		return serve(t, b.Reopen(t, hs.inner))
	}
	if b.Replica != nil {
		wrapped.Replica = func(t *testing.T, s store.LockStore) store.LockStore {
			return serve(t, b.Replica(t, s.(*httpStore).inner))
		}
	}
	if b.StepClock != nil {
		wrapped.StepClock = func(t *testing.T, s store.LockStore, d time.Duration) {
			b.StepClock(t, s.(*httpStore).inner, d)
		}
	}
	if b.RestartBackend != nil {
		wrapped.RestartBackend = func(t *testing.T) (store.LockStore, func()) {
			inner, restart := b.RestartBackend(t)
			return serve(t, inner), restart
		}
	}
	return wrapped
}

// httpStore is a LockStore that forwards every call over HTTP.
type httpStore struct {
	inner store.LockStore
	srv   *httptest.Server
	c     *client.Client
}

func serve(t *testing.T, inner store.LockStore) *httpStore {
	t.Helper()
	h, err := lockserver.NewServer(inner, lockserver.DefaultServerConfig(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("NewServer: %v", err)
	}
	srv := httptest.NewServer(h)
	// A zero drift allowance: the suite checks the server's semantics, and the
	// SDK must not refuse a short-TTL grant on its own account.
	c, err := client.New(srv.URL, client.WithDriftAllowance(0, 0))
	if err != nil {
		t.Fatalf("client.New: %v", err)
	}
	return &httpStore{inner: inner, srv: srv, c: c}
}

// Remote returns a LockStore that forwards every call through c to the
// lock-server c points at, as OverHTTP's stores do, mapping SDK errors to
// the LockStore sentinels (ErrUnavailable: outcome unknown). Close closes
// nothing.
func Remote(c *client.Client) store.LockStore { return &httpStore{c: c} }

// fromSDK maps an SDK error to the LockStore sentinel of the same meaning,
// keeping the SDK error in the chain.
func fromSDK(err error) error {
	if err == nil {
		return nil
	}
	for _, m := range []struct{ sdk, store error }{
		{client.ErrLockHeld, store.ErrLockHeld},
		{client.ErrStaleToken, store.ErrStaleToken},
		{client.ErrNotHeld, store.ErrNotHeld},
		{client.ErrInvalidRequest, store.ErrInvalidArgument},
		{client.ErrUnavailable, store.ErrUnavailable},
	} {
		if errors.Is(err, m.sdk) {
			return fmt.Errorf("%w: %w", m.store, err)
		}
	}
	return err
}

func leaseOf(g api.Grant) store.Lease {
	return store.Lease{
		Key: g.Key, Owner: g.Owner, Token: g.Token, LeaseID: g.LeaseID,
		TTL: time.Duration(g.TTLMs) * time.Millisecond, ExpiresAt: g.ExpiresAt,
	}
}

func (h *httpStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (store.Lease, error) {
	l, err := h.c.TryAcquire(ctx, key, client.WithTTL(ttl), client.WithLeaseOwner(owner))
	if err != nil {
		return store.Lease{}, fromSDK(err)
	}
	return leaseOf(l.Grant()), nil
}

func (h *httpStore) Renew(ctx context.Context, key, owner string, token int64) (store.Lease, error) {
	g, err := h.c.RenewLease(ctx, key, owner, token)
	if err != nil {
		return store.Lease{}, fromSDK(err)
	}
	return leaseOf(g), nil
}

func (h *httpStore) Release(ctx context.Context, key, owner string, token int64) error {
	return fromSDK(h.c.ReleaseLease(ctx, key, owner, token))
}

func (h *httpStore) Revoke(ctx context.Context, key string, token int64) (store.Lease, error) {
	g, err := h.c.Revoke(ctx, key, token, "storetest")
	if err != nil {
		return store.Lease{}, fromSDK(err)
	}
	return leaseOf(g), nil
}

func (h *httpStore) Inspect(ctx context.Context, key string) (store.State, error) {
	st, err := h.c.Inspect(ctx, key)
	if err != nil {
		return store.State{}, fromSDK(err)
	}
	out := store.State{Key: st.Key, LastToken: st.LastToken}
	if st.Lease != nil {
		l := leaseOf(*st.Lease)
		out.Lease = &l
	}
	return out, nil
}

func (h *httpStore) Ping(ctx context.Context) error {
	return fromSDK(h.c.Ready(ctx))
}

func (h *httpStore) Close() error {
	if h.srv == nil {
		return nil // Remote
	}
	h.srv.Close()
	return h.inner.Close()
}
