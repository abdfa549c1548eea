// Command local runs the system on this machine, on loopback only.
//
//	go run ./local up      the whole stack as separate processes (package
//	                       local/stack); prints every URL and runs until
//	                       Ctrl-C, SIGTERM or SIGHUP, or until its parent
//	                       process exits (flags: go run ./local up -h)
//	go run ./local demo    one lease through the SDK: an embedded etcd, a
//	                       lock-server, two workers contending for
//	                       payout:acct-7
//
// Everything it starts is stopped before it exits. The go command passes
// no signal on and ignores a SIGINT sent to it alone: signal this process
// or its process group (README.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/etcd/embedded"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpserve"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/etcdstore"
)

func main() {
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: go run ./local up [flags] | go run ./local demo")
	}
	flag.Parse()
	if flag.NArg() < 1 {
		flag.Usage()
		os.Exit(2)
	}
	// SIGHUP too (a closed terminal), unless started under nohup.
	sigs := []os.Signal{os.Interrupt, syscall.SIGTERM}
	if !signal.Ignored(syscall.SIGHUP) {
		sigs = append(sigs, syscall.SIGHUP)
	}
	ctx, stop := signal.NotifyContext(context.Background(), sigs...)
	defer stop()
	var err error
	switch flag.Arg(0) {
	case "demo":
		if flag.NArg() != 1 {
			flag.Usage()
			os.Exit(2)
		}
		err = demo(ctx, os.Stdout)
	case "up":
		err = up(ctx, flag.Args()[1:], os.Stdout)
	default:
		flag.Usage()
		os.Exit(2)
	}
	switch {
	case errors.Is(err, flag.ErrHelp):
		// -h printed the usage; asking for it is not a failure.
	case err != nil:
		fmt.Fprintf(os.Stderr, "local %s: %v\n", flag.Arg(0), err)
		os.Exit(1)
	}
}

// demo starts a one-member embedded etcd and a lock-server on free loopback
// ports, and shows a grant, a refusal, a renewal, a stale release being
// refused and a strictly larger token after expiry, printing each step to out.
func demo(ctx context.Context, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cluster, err := embedded.Start(ctx, embedded.Config{})
	if err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	defer cluster.Close()
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	scfg := etcdstore.DefaultConfig()
	scfg.Endpoints = cluster.Endpoints()
	store, err := etcdstore.Open(ctx, scfg, log)
	if err != nil {
		return fmt.Errorf("open etcd store: %w", err)
	}
	defer store.Close()
	h, err := lockserver.NewServer(store, lockserver.DefaultServerConfig(), log)
	if err != nil {
		return err
	}
	// Deferred calls run last first: the HTTP drain below, then this (the
	// releases of abandoned grants), then the store's Close above.
	defer h.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	sctx, stopServer := context.WithCancel(ctx)
	served := make(chan error, 1)
	// Ends when sctx ends and the drain is over.
	go func() { served <- httpserve.Serve(sctx, ln, h, httpserve.DefaultConfig(), log) }()
	defer func() { stopServer(); <-served }()
	base := "http://" + ln.Addr().String()
	fmt.Fprintf(out, "etcd at %v; lock-server at %s\n\n", cluster.Endpoints(), base)

	a, err := client.New(base, client.WithOwner("A"))
	if err != nil {
		return err
	}
	b, err := client.New(base, client.WithOwner("B"))
	if err != nil {
		return err
	}
	const key = "payout:acct-7"
	sent := time.Now()
	la, err := a.TryAcquire(ctx, key, client.WithTTL(2*time.Second))
	if err != nil {
		return fmt.Errorf("worker A acquire: %w", err)
	}
	g := la.Grant()
	fmt.Fprintf(out, "[A] acquire %s -> GRANTED fencingToken=%d ttl=%dms lease=%s\n", key, la.Token(), g.TTLMs, g.LeaseID)
	fmt.Fprintf(out, "    A's local deadline: %v after it sent the request (the TTL minus the drift allowance)\n", la.Deadline().Sub(sent).Round(10*time.Millisecond))
	if _, err := b.TryAcquire(ctx, key, client.WithTTL(2*time.Second)); !errors.Is(err, client.ErrLockHeld) {
		return fmt.Errorf("worker B acquire while A holds: got %v, want LOCK_HELD", err)
	}
	fmt.Fprintf(out, "[B] acquire %s -> LOCK_HELD\n", key)
	if err := la.Renew(ctx); err != nil {
		return fmt.Errorf("worker A renew: %w", err)
	}
	fmt.Fprintf(out, "[A] renew -> OK, still token %d\n", la.Token())
	fmt.Fprintf(out, "[A] stops renewing and stalls; its handle reports the loss at its deadline...\n")
	<-la.Done()
	fmt.Fprintf(out, "[A] lease handle: %v\n", la.Err())
	lb, err := b.Acquire(ctx, key, client.WithTTL(2*time.Second))
	if err != nil {
		return fmt.Errorf("worker B acquire after A's expiry: %w", err)
	}
	fmt.Fprintf(out, "[B] acquire %s (waiting with backoff until etcd expires A's lease) -> GRANTED fencingToken=%d\n", key, lb.Token())
	if err := la.Release(ctx); !errors.Is(err, client.ErrStaleToken) {
		return fmt.Errorf("late release by worker A: got %v, want STALE_TOKEN", err)
	}
	fmt.Fprintf(out, "[A] late release with token %d -> STALE_TOKEN (B's lease is untouched)\n", la.Token())
	st, err := b.Inspect(ctx, key)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "    inspect: held=%v owner=%s token=%d\n", st.Held, st.Lease.Owner, st.Lease.Token)
	if err := lb.Release(ctx); err != nil {
		return fmt.Errorf("worker B release: %w", err)
	}
	fmt.Fprintf(out, "[B] release -> OK\n\n")
	fmt.Fprintf(out, "The lock did its job: one holder at a time, token %d then %d. It could not stop A\n", la.Token(), lb.Token())
	fmt.Fprintf(out, "from acting after its lease ended; only a resource that checks the token can.\n")
	return nil
}
