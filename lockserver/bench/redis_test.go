package bench

// The peer row: what users pick instead of a lock
// service with fencing tokens. go-redsync's Mutex on one local Redis
// (Debian's redis-server, started here on a free port, persistence off,
// as such locks are usually run). It has NO fencing token (its value is a
// random string that only the holder's own unlock compares) and NO
// durability (a Redis restart forgets every lock), so its figures are
// the price of neither, not a like-for-like comparison:
//
//	backend=redis/path=redsync  redsync.Mutex Lock/Unlock (SET NX PX, then a Lua compare-and-delete);
//	                            contended: redsync's own retry (tries every 50-250 ms, random), i.e. barging
//
// Without redis-server on PATH the rows are skipped with one line; `make
// test` never runs benchmarks.

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredislib "github.com/redis/go-redis/v9"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
)

var (
	redisOnce sync.Once
	redisAddr string
	redisErr  error
)

// errNoRedis marks a machine without redis-server.
var errNoRedis = fmt.Errorf("redis-server is not on PATH (Debian: apt-get install redis-server); the redsync rows are skipped")

// sharedRedis starts one redis-server for the whole run (no persistence,
// loopback only, a free port) and returns its address; pgtest.Main stops
// it when the run ends.
func sharedRedis(b *testing.B) string {
	redisOnce.Do(func() {
		bin, err := exec.LookPath("redis-server")
		if err != nil {
			redisErr = errNoRedis
			return
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			redisErr = err
			return
		}
		port := ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
		dir, err := os.MkdirTemp("", "bench-redis-")
		if err != nil {
			redisErr = err
			return
		}
		cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", strconv.Itoa(port), "--dir", dir,
			"--save", "", "--appendonly", "no", "--protected-mode", "yes")
		if err := cmd.Start(); err != nil {
			redisErr = err
			return
		}
		pgtest.AtExit(func() error {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return os.RemoveAll(dir)
		})
		redisAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		// The pool logs every refused dial while redis-server starts.
		goredislib.SetLogger(quietRedis{})
		cli := goredislib.NewClient(&goredislib.Options{Addr: redisAddr})
		defer cli.Close()
		deadline := time.Now().Add(30 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := cli.Ping(ctx).Err()
			cancel()
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				redisErr = fmt.Errorf("redis-server on %s did not answer: %w", redisAddr, err)
				return
			}
			time.Sleep(20 * time.Millisecond) // polling for start-up
		}
	})
	if redisErr == errNoRedis {
		b.Skip(redisErr.Error())
	}
	if redisErr != nil {
		b.Fatal(redisErr)
	}
	return redisAddr
}

// quietRedis drops go-redis's log lines (dial retries during start-up).
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// redsyncFor returns a Redsync over one client of addr and its close.
func redsyncFor(addr string) (*redsync.Redsync, func()) {
	cli := goredislib.NewClient(&goredislib.Options{Addr: addr})
	return redsync.New(goredis.NewPool(cli)), func() { _ = cli.Close() }
}

// redsyncOptions: a 30 s expiry like the other rows' TTL, and retries
// without end (redsync gives up after 32 tries by default, which 64
// contenders exceed), so that it waits as long as the others.
var redsyncOptions = []redsync.Option{redsync.WithExpiry(30 * time.Second), redsync.WithTries(1 << 30)}

// redisAcquireRelease is BenchmarkAcquireRelease's backend=redis.
func redisAcquireRelease(b *testing.B) {
	b.Run("backend=redis", func(b *testing.B) {
		addr := sharedRedis(b)
		for _, n := range clientCounts {
			b.Run(fmt.Sprintf("path=redsync/clients=%d", n), func(b *testing.B) {
				pairs(b, n, func(c int) (func(string) error, func()) {
					rs, done := redsyncFor(addr)
					return func(key string) error {
						m := rs.NewMutex("bench-redsync-"+key, redsyncOptions...)
						if err := m.LockContext(context.Background()); err != nil {
							return err
						}
						_, err := m.UnlockContext(context.Background())
						return err
					}, done
				})
			})
		}
	})
}

// redisContended is BenchmarkContended's backend=redis.
func redisContended(b *testing.B) {
	b.Run("backend=redis", func(b *testing.B) {
		addr := sharedRedis(b)
		for _, n := range contendedClients {
			b.Run(fmt.Sprintf("path=redsync/clients=%d", n), func(b *testing.B) {
				handoffs(b, n, func(c int) (locker, func()) {
					rs, done := redsyncFor(addr)
					return func(ctx context.Context) (func() error, error) {
						m := rs.NewMutex("bench-redsync-contended", redsyncOptions...)
						if err := m.LockContext(ctx); err != nil {
							return nil, err
						}
						return func() error { _, err := m.UnlockContext(ctx); return err }, nil
					}, done
				})
			})
		}
	})
}
