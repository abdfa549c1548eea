package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
)

// startLockServer runs a stand-in for lock-server (server_test.go), for
// the examples; a real program is given the URL of a deployed lock-server.
func startLockServer() (url string, stop func()) {
	s := httptest.NewServer(newLockServer())
	return s.URL, s.Close
}

// ledger is a resource that enforces the fencing token: it remembers the
// highest token it has accepted and refuses any write with a token not
// greater (a strict fence point).
type ledger struct {
	mu      sync.Mutex
	highest int64
	entries []string
}

func (l *ledger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	token, err := strconv.ParseInt(r.Header.Get("X-Fencing-Token"), 10, 64)
	if err != nil || token <= 0 {
		http.Error(w, "missing fencing token", http.StatusBadRequest)
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if token <= l.highest {
		http.Error(w, "fenced out", http.StatusConflict)
		return
	}
	l.highest = token
	l.entries = append(l.entries, r.URL.Query().Get("entry"))
}

// fencedWrite sends one entry to the resource with the lease's token.
func fencedWrite(ctx context.Context, url string, lease *client.Lease, entry string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"?entry="+entry, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-Fencing-Token", strconv.FormatInt(lease.Token(), 10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// Take a lease with automatic renewal, make a fenced write under it, and
// give it back.
func Example() {
	lockURL, stop := startLockServer()
	defer stop()
	res := httptest.NewServer(&ledger{})
	defer res.Close()

	c, err := client.New(lockURL, client.WithOwner("worker-1"))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	lease, err := c.Acquire(ctx, "payout:acct-7", client.WithTTL(10*time.Second), client.WithAutoRenew(0))
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)

	// Before the side effect: ask the server, then send the token along.
	if err := lease.Renew(ctx); err != nil {
		log.Fatal(err)
	}
	status, err := fencedWrite(ctx, res.URL, lease, "debit-2500")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("token", lease.Token(), "write answered", status)
	// Output: token 1 write answered 200
}

// A stale holder is refused by the resource, not by the lock: its lease was
// revoked and granted again, and the resource has seen the newer token.
func Example_fencedWrite() {
	lockURL, stop := startLockServer()
	defer stop()
	res := httptest.NewServer(&ledger{})
	defer res.Close()
	ctx := context.Background()

	a, _ := client.New(lockURL, client.WithOwner("worker-a"))
	b, _ := client.New(lockURL, client.WithOwner("worker-b"))
	leaseA, err := a.Acquire(ctx, "payout:acct-7", client.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	// An operator revokes A's lease while A is paused; B takes the lock.
	if _, err := b.Revoke(ctx, "payout:acct-7", leaseA.Token(), "stuck worker"); err != nil {
		log.Fatal(err)
	}
	leaseB, err := b.Acquire(ctx, "payout:acct-7", client.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	statusB, _ := fencedWrite(ctx, res.URL, leaseB, "debit-2500")
	// A wakes up without asking the server and writes anyway.
	statusA, _ := fencedWrite(ctx, res.URL, leaseA, "debit-2500")
	fmt.Println("B with token", leaseB.Token(), "->", statusB)
	fmt.Println("A with token", leaseA.Token(), "->", statusA)
	// Output:
	// B with token 2 -> 200
	// A with token 1 -> 409
}

// A holder that renews before its side effect learns of a revoke there, and
// sends nothing; the lease reports itself lost from then on.
func ExampleLease_Renew() {
	lockURL, stop := startLockServer()
	defer stop()
	ctx := context.Background()

	c, _ := client.New(lockURL, client.WithOwner("worker-a"))
	lease, err := c.Acquire(ctx, "payout:acct-7", client.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	operator, _ := client.New(lockURL)
	if _, err := operator.Revoke(ctx, "payout:acct-7", lease.Token(), "game day"); err != nil {
		log.Fatal(err)
	}
	// The local deadline is 10 s away, so only the server can tell.
	fmt.Println("local check:", lease.Check())
	err = lease.Renew(ctx)
	fmt.Println("lost:", errors.Is(err, client.ErrLeaseLost), "not held:", errors.Is(err, client.ErrNotHeld))
	<-lease.Done()
	fmt.Println("held:", lease.Held())
	// Output:
	// local check: <nil>
	// lost: true not held: true
	// held: false
}

// Done is closed when the lease is lost (revoked, expired by the local
// deadline, or released): the place to stop work in progress.
func ExampleLease_Done() {
	lockURL, stop := startLockServer()
	defer stop()
	ctx := context.Background()

	c, _ := client.New(lockURL)
	lease, err := c.Acquire(ctx, "report:daily", client.WithTTL(10*time.Second), client.WithAutoRenew(0))
	if err != nil {
		log.Fatal(err)
	}
	work, cancel := context.WithCancel(ctx)
	go func() {
		<-lease.Done()
		cancel() // stop whatever runs under the lease
	}()
	if err := lease.Release(ctx); err != nil {
		log.Fatal(err)
	}
	<-work.Done()
	fmt.Println(errors.Is(lease.Err(), client.ErrReleased))
	// Output: true
}

// With WithWait, an acquire of a held key waits in lock-server's queue for
// the key instead of backing off: it is granted in about one round trip
// after the holder releases, and waiters are served in arrival order.
func ExampleWithWait() {
	lockURL, stop := startLockServer()
	defer stop()
	ctx := context.Background()

	a, _ := client.New(lockURL, client.WithOwner("worker-a"))
	b, _ := client.New(lockURL, client.WithOwner("worker-b"))
	leaseA, err := a.Acquire(ctx, "payout:acct-7", client.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	granted := make(chan *client.Lease)
	go func() {
		// Each request waits up to 5 s in the queue; Acquire asks again
		// until ctx ends.
		l, err := b.Acquire(ctx, "payout:acct-7", client.WithTTL(10*time.Second), client.WithWait(5*time.Second))
		if err != nil {
			log.Fatal(err)
		}
		granted <- l
	}()
	if err := leaseA.Release(ctx); err != nil {
		log.Fatal(err)
	}
	leaseB := <-granted
	defer leaseB.Release(ctx)
	fmt.Println(leaseB.Owner(), "holds token", leaseB.Token(), "after token", leaseA.Token())
	// Output: worker-b holds token 2 after token 1
}

// TryAcquire asks once: a key another holder has is refused at once with
// ErrLockHeld, and Inspect shows who holds it.
func ExampleClient_TryAcquire() {
	lockURL, stop := startLockServer()
	defer stop()
	ctx := context.Background()

	a, _ := client.New(lockURL, client.WithOwner("worker-a"))
	b, _ := client.New(lockURL, client.WithOwner("worker-b"))
	lease, err := a.TryAcquire(ctx, "payout:acct-7", client.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	_, err = b.TryAcquire(ctx, "payout:acct-7", client.WithTTL(10*time.Second))
	fmt.Println("lock held:", errors.Is(err, client.ErrLockHeld))
	st, err := b.Inspect(ctx, "payout:acct-7")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("holder:", st.Lease.Owner, "token:", st.Lease.Token)
	// Output:
	// lock held: true
	// holder: worker-a token: 1
}
