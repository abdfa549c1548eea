package lockserver_test

import (
	"context"
	"fmt"
	"net"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// hangUpStore is a memstore whose Acquire by owner "gone" grants the key,
// tells granted, then answers only once its context has ended (or after
// 5 s, when it never does).
type hangUpStore struct {
	*memstore.Store
	granted chan struct{}
	ended   chan bool // whether the context ended
}

func (s *hangUpStore) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (store.Lease, error) {
	if owner != "gone" {
		return s.Store.Acquire(ctx, key, owner, ttl)
	}
	l, err := s.Store.Acquire(context.WithoutCancel(ctx), key, owner, ttl)
	close(s.granted)
	select {
	case <-ctx.Done():
		s.ended <- true
	case <-time.After(5 * time.Second):
		s.ended <- false
	}
	return l, err
}

// TestAClientThatHangsUpWhileGrantedLeavesTheKeyFree: over a real TCP
// connection (the other tests end the request's context by hand), a
// client sends an acquire and closes its connection while the backend
// grants it. net/http must end the request's context (the handler read
// the body to its end, so the server watches the connection), the
// handler must then answer nothing and release the grant: after Close
// the key is free although the grant had a minute of TTL.
func TestAClientThatHangsUpWhileGrantedLeavesTheKeyFree(t *testing.T) {
	for _, batching := range []bool{false, true} {
		t.Run(fmt.Sprintf("batching=%v", batching), func(t *testing.T) {
			const key = "payout:acct-hangup"
			store := &hangUpStore{Store: memstore.New(nil), granted: make(chan struct{}), ended: make(chan bool, 1)}
			h, _ := abandonServer(t, store, func(c *lockserver.ServerConfig) { c.Batching = batching })
			srv := httptest.NewServer(h)
			defer srv.Close()
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			body := `{"owner":"gone","ttlMs":60000}`
			fmt.Fprintf(conn, "POST %s%s%s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
				api.PathLockPrefix, key, api.SuffixAcquire, len(body), body)
			select {
			case <-store.granted:
			case <-time.After(10 * time.Second):
				t.Fatal("the acquire never reached the store")
			}
			_ = conn.Close()
			if !<-store.ended {
				t.Fatal("the request's context did not end within 5 s of its client closing the connection")
			}
			srv.Close() // the handler has answered (nothing reaches the closed connection)
			if err := h.Close(); err != nil {
				t.Fatal(err)
			}
			if l := liveLease(t, store, key); l != nil {
				t.Fatalf("key %q held by %+v after its client hung up during the grant; want released", key, *l)
			}
		})
	}
}
