package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/etcd/embedded"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpserve"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// start runs lock-server with env until the returned stop is called, and
// returns its base URL.
func start(t *testing.T, env map[string]string) (base string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, func(k string) string { return env[k] }, nil, os.Stderr, ready) }()
	select {
	case addr := <-ready:
		return "http://" + addr.String(), func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("lock-server exited with %v after a graceful stop", err)
			}
		}
	case err := <-done:
		cancel()
		t.Fatalf("lock-server did not start: %v", err)
	case <-time.After(time.Minute):
		cancel()
		t.Fatal("lock-server not ready after a minute")
	}
	return "", nil
}

// TestTokensIncreaseAcrossLockServerRestarts runs the real main loop on each
// backend, takes a lease through the SDK, stops the server gracefully while
// the lease is live, starts a new one, and checks the lease survived and the
// next grant has a larger token.
func TestTokensIncreaseAcrossLockServerRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and etcd")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cluster, err := embedded.Start(ctx, embedded.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Cleanup(t, cluster.Close)
	backends := map[string]map[string]string{
		"postgres": {"LOCK_STORE": "postgres", "LOCKDB_URL": pgtest.NewDatabase(t)},
		"etcd":     {"LOCK_STORE": "etcd", "ETCD_ENDPOINTS": cluster.Endpoints()[0]},
	}
	for name, env := range backends {
		t.Run(name, func(t *testing.T) {
			env["LOCK_HTTP_ADDR"] = "127.0.0.1:0"
			env["LOG_LEVEL"] = "warn"
			base, stop := start(t, env)
			c, err := client.New(base, client.WithOwner("worker-a"))
			if err != nil {
				t.Fatal(err)
			}
			a, err := c.TryAcquire(ctx, "payout:acct-1", client.WithTTL(30*time.Second))
			if err != nil {
				t.Fatalf("acquire: %v", err)
			}
			stop()

			base, stop = start(t, env)
			defer stop()
			c, err = client.New(base, client.WithOwner("worker-b"))
			if err != nil {
				t.Fatal(err)
			}
			st, err := c.Inspect(ctx, "payout:acct-1")
			if err != nil || st.Lease == nil || st.Lease.Token != a.Token() {
				t.Fatalf("after restart: %+v, %v; want A's lease %d still live", st, err, a.Token())
			}
			if _, err := c.TryAcquire(ctx, "payout:acct-1"); !errors.Is(err, client.ErrLockHeld) {
				t.Fatalf("acquire after restart while A holds: %v; want LOCK_HELD", err)
			}
			if _, err := c.Revoke(ctx, "payout:acct-1", a.Token(), "test"); err != nil {
				t.Fatalf("revoke: %v", err)
			}
			b, err := c.TryAcquire(ctx, "payout:acct-1", client.WithTTL(30*time.Second))
			if err != nil {
				t.Fatalf("acquire after revoke: %v", err)
			}
			if b.Token() <= a.Token() {
				t.Fatalf("token %d after a lock-server restart; want > %d", b.Token(), a.Token())
			}
		})
	}
}

func TestRunRefusesABadConfiguration(t *testing.T) {
	err := run(context.Background(), func(k string) string { return map[string]string{"LOCK_STORE": "zookeeper"}[k] }, nil, io.Discard, nil)
	if err == nil {
		t.Fatal("run started with LOCK_STORE=zookeeper")
	}
}

// TestMetricsEndpoint: the real main loop serves /metrics with the request
// counts and, on etcd, the lease counts.
func TestMetricsEndpoint(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cluster, err := embedded.Start(ctx, embedded.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Cleanup(t, cluster.Close)
	base, stop := start(t, map[string]string{"LOCK_STORE": "etcd", "ETCD_ENDPOINTS": cluster.Endpoints()[0], "LOG_LEVEL": "warn", "LOCK_HTTP_ADDR": "127.0.0.1:0"})
	defer stop()
	c, err := client.New(base, client.WithOwner("worker-a"))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		l, err := c.TryAcquire(ctx, "payout:acct-1", client.WithTTL(5*time.Second))
		if err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, want := range []string{
		`lockserver_requests_total{code="OK",op="acquire"} 3`,
		`lockserver_requests_total{code="OK",op="release"} 3`,
		"lockserver_etcd_leases_granted_total ",
		"lockserver_etcd_grants_from_pool_total ",
		"lockserver_etcd_idle_leases ",
		"go_goroutines",
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// Each of the 3 grants had a lease of its own, granted inline or
	// ahead of time.
	if m := regexp.MustCompile(`(?m)^lockserver_etcd_leases_granted_total (\d+)$`).FindSubmatch(b); m == nil {
		t.Errorf("/metrics has no lockserver_etcd_leases_granted_total value")
	} else if n, _ := strconv.Atoi(string(m[1])); n < 3 {
		t.Errorf("lockserver_etcd_leases_granted_total %d after 3 grants; want at least 3 (one lease per grant)", n)
	}
	// The 3 ended grants' leases are revoked off the requests' path.
	revoked := regexp.MustCompile(`(?m)^lockserver_etcd_leases_revoked_total (\d+)$`)
	for deadline := time.Now().Add(20 * time.Second); ; {
		b = metricsOf(t, base)
		m := revoked.FindSubmatch(b)
		if m == nil {
			t.Fatalf("/metrics has no lockserver_etcd_leases_revoked_total:\n%s", b)
		}
		if n, _ := strconv.Atoi(string(m[1])); n == 3 {
			break
		} else if n > 3 || time.Now().After(deadline) {
			t.Fatalf("lockserver_etcd_leases_revoked_total %d after 3 releases; want 3", n)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition, not a fixed sleep
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", b)
	}
}

// metricsOf reads base's /metrics.
func metricsOf(t *testing.T, base string) []byte {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestHardenedHTTPSurface: the real main loop serves through
// internal/httpserve: a path that is not canonical gets 400 with the
// envelope on every route (never a redirect), and oversized headers get
// 431.
func TestHardenedHTTPSurface(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cluster, err := embedded.Start(ctx, embedded.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pgtest.Cleanup(t, cluster.Close)
	base, stop := start(t, map[string]string{"LOCK_STORE": "etcd", "ETCD_ENDPOINTS": cluster.Endpoints()[0], "LOG_LEVEL": "warn", "LOCK_HTTP_ADDR": "127.0.0.1:0"})
	defer stop()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, tc := range []struct{ method, path string }{
		{"POST", "/v1/locks/x/../payout:acct-1/acquire"},
		{"POST", "/v1/locks/payout:acct-1/./release"},
		{"GET", "/v1//locks/payout:acct-1"},
		{"GET", "/x/../readyz"},
		{"GET", "/v1/../metrics"},
	} {
		req, err := http.NewRequestWithContext(ctx, tc.method, base+tc.path, strings.NewReader(`{"owner":"w","ttlMs":1000}`))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var env jsonhandler.Envelope
		derr := json.NewDecoder(resp.Body).Decode(&env)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || derr != nil || env.Error.Code != string(api.CodeInvalidRequest) {
			t.Errorf("%s %s = %d (%+v, %v); want 400 with the envelope and %s", tc.method, tc.path, resp.StatusCode, env, derr, api.CodeInvalidRequest)
		}
	}
	req, err := http.NewRequestWithContext(ctx, "GET", base+api.PathHealth, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Big", strings.Repeat("a", httpserve.DefaultConfig().MaxHeaderBytes+8<<10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("GET %s with %d bytes of headers = %d; want 431", api.PathHealth, httpserve.DefaultConfig().MaxHeaderBytes+8<<10, resp.StatusCode)
	}
}

// TestWriteTimeoutOutlastsTheLongestWait: the server's write bound must
// let a waiting acquire granted at the very end of the longest wait
// (api.MaxWaitMs) and its backend call still answer. The newcomer's probe
// found it 10 s (RequestTimeout + 5 s): any wait past that lost its
// answer while the grant stood.
func TestWriteTimeoutOutlastsTheLongestWait(t *testing.T) {
	for _, rt := range []time.Duration{time.Second, 5 * time.Second, 30 * time.Second} {
		longest := time.Duration(api.MaxWaitMs)*time.Millisecond + rt
		if got := writeTimeout(rt); got <= longest {
			t.Errorf("writeTimeout(%v) = %v; want more than the longest wait plus the backend call, %v", rt, got, longest)
		}
	}
}
