package main

import (
	"bytes"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/envcheck"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	lockcfg "github.com/distributed-lock-lab/distributed-lock-lab/lockserver/config"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof/fenceprooftest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/etcdstore"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/pgstore"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestConfigDefaultsAndOverrides(t *testing.T) {
	c, err := loadConfig(env(map[string]string{"LOCKDB_URL": "postgres://x/lockdb"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Store != "postgres" || c.Addr != "127.0.0.1:8080" || c.RequestTimeout != 5*time.Second || c.LockDB.MaxConns != 16 || c.Etcd.IdleLeases != 64 ||
		!c.Batching || c.Batch.MaxSize != 64 || c.Batch.Window != 0 || c.LockDB.AcceptPromotion || !c.Handoff {
		t.Fatalf("defaults: %+v", c)
	}
	// A multi-host DSN that follows a failover, with promotions accepted.
	c, err = loadConfig(env(map[string]string{
		"LOCKDB_URL":              "postgres://u@10.0.0.1:5432,10.0.0.2:5432/lockdb?target_session_attrs=read-write",
		"LOCKDB_ACCEPT_PROMOTION": "true",
	}))
	if err != nil || !c.LockDB.AcceptPromotion || c.LockDB.ReplicationCheckInterval <= 0 {
		t.Fatalf("LOCKDB_ACCEPT_PROMOTION=true: %+v, %v", c.LockDB, err)
	}
	c, err = loadConfig(env(map[string]string{
		"LOCK_STORE": "etcd", "ETCD_ENDPOINTS": "http://a:2379, http://b:2379,", "PORT": "9000",
		"LOCK_REQUEST_TIMEOUT_MS": "750", "LOG_LEVEL": "debug", "ETCD_IDLE_LEASES": "0",
		"LOCK_BATCH_ENABLED": "false", "LOCK_BATCH_MAX": "8", "LOCK_BATCH_WINDOW_US": "250",
		"LOCK_HANDOFF_ENABLED": "false",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Store != "etcd" || len(c.Etcd.Endpoints) != 2 || c.Etcd.Endpoints[1] != "http://b:2379" || c.Addr != ":9000" || c.RequestTimeout != 750*time.Millisecond ||
		c.Etcd.RequestTimeout != 750*time.Millisecond || c.Etcd.IdleLeases != 0 || c.Etcd.Validate() != nil ||
		c.Batching || c.Batch.MaxSize != 8 || c.Batch.Window != 250*time.Microsecond || c.Handoff {
		t.Fatalf("overrides: %+v", c)
	}
}

// Group grant is off by default with etcd (one transaction's keys share a
// revision, so two keys could carry one token: INV-02 says no token is
// issued twice) and can be turned on.
func TestBatchingDefaultsOffWithEtcd(t *testing.T) {
	base := map[string]string{"LOCK_STORE": "etcd", "ETCD_ENDPOINTS": "http://a:2379"}
	c, err := loadConfig(env(base))
	if err != nil {
		t.Fatal(err)
	}
	if c.Batching {
		t.Fatal("batching on by default with etcd; want off")
	}
	base["LOCK_BATCH_ENABLED"] = "true"
	if c, err = loadConfig(env(base)); err != nil || !c.Batching {
		t.Fatalf("LOCK_BATCH_ENABLED=true with etcd: batching %v, %v; want on", c.Batching, err)
	}
}

func TestConfigRejectsBadValues(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"LOCK_STORE": "floppy"}, "want postgres or etcd"},
		{map[string]string{"LOCK_STORE": "postgres"}, "LOCKDB_URL"},
		{map[string]string{"LOCK_STORE": "etcd"}, "ETCD_ENDPOINTS"},
		{map[string]string{"LOCKDB_URL": "x", "LOCK_REQUEST_TIMEOUT_MS": "-5"}, "LOCK_REQUEST_TIMEOUT_MS"},
		{map[string]string{"LOCKDB_URL": "x", "LOCKDB_MAX_CONNS": "many"}, "LOCKDB_MAX_CONNS"},
		{map[string]string{"LOCKDB_URL": "x", "LOCKDB_ACCEPT_PROMOTION": "yes"}, "LOCKDB_ACCEPT_PROMOTION"},
		{map[string]string{"LOCKDB_URL": "x", "LOG_LEVEL": "loud"}, "LOG_LEVEL"},
		{map[string]string{"LOCKDB_URL": "x", "ETCD_IDLE_LEASES": "-1"}, "ETCD_IDLE_LEASES"},
		{map[string]string{"LOCKDB_URL": "x", "ETCD_PREFIX": "/x"}, "ETCD_PREFIX"},
		{map[string]string{"LOCKDB_URL": "x", "ETCD_PREFIX": "x/"}, "ETCD_PREFIX"},
		{map[string]string{"LOCKDB_URL": "x", "ETCD_IDLE_LEASES": "lots"}, "ETCD_IDLE_LEASES"},
		{map[string]string{"LOCKDB_URL": "x", "LOG_LEVEL": "DEBUG+2"}, "LOG_LEVEL"},
		{map[string]string{"LOCKDB_URL": "x", "LOCK_REQUEST_TIMEOUT_MS": "9223372036854775807"}, "LOCK_REQUEST_TIMEOUT_MS"},
		{map[string]string{"LOCKDB_URL": "x", "PORT": "abc"}, "PORT"},
		{map[string]string{"LOCKDB_URL": "x", "PORT": "70000"}, "PORT"},
		{map[string]string{"LOCKDB_URL": "x", "PORT": "080"}, "PORT"},
		{map[string]string{"LOCKDB_URL": "x", "LOCK_BATCH_ENABLED": "yes"}, "LOCK_BATCH_ENABLED"},
		{map[string]string{"LOCKDB_URL": "x", "LOCK_HANDOFF_ENABLED": "on"}, "LOCK_HANDOFF_ENABLED"},
		{map[string]string{"LOCKDB_URL": "x", "LOCK_BATCH_MAX": "0"}, "LOCK_BATCH_MAX"},
		{map[string]string{"LOCKDB_URL": "x", "LOCK_BATCH_MAX": "5000"}, "LOCK_BATCH_MAX"},
		{map[string]string{"LOCKDB_URL": "x", "LOCK_BATCH_WINDOW_US": "-1"}, "LOCK_BATCH_WINDOW_US"},
		{map[string]string{"LOCKDB_URL": "x", "LOCK_BATCH_WINDOW_US": "1000000"}, "LOCK_BATCH_WINDOW_US"},
		{map[string]string{"LOCKDB_URL": "x", "LOCK_STALL_PROBE_TIMEOUT_MS": "0"}, "LOCK_STALL_PROBE_TIMEOUT_MS"},
		{map[string]string{"LOCKDB_URL": "x", "LOCK_STALL_PROBE_TIMEOUT_MS": "60001"}, "LOCK_STALL_PROBE_TIMEOUT_MS"},
		{map[string]string{"LOCKDB_URL": "x", "LOCK_STALL_PROBE_TIMEOUT_MS": "soon"}, "LOCK_STALL_PROBE_TIMEOUT_MS"},
	} {
		_, err := loadConfig(env(tc.env))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("loadConfig(%v) = %v; want an error mentioning %q", tc.env, err, tc.want)
		}
	}
}

// TestLoadConfigReportsEveryInvalidVariable: one run of loadConfig names
// every variable to fix, those that do not parse and those that contradict
// the chosen store.
func TestLoadConfigReportsEveryInvalidVariable(t *testing.T) {
	_, err := loadConfig(env(map[string]string{
		lockcfg.EnvStore: "etcd", lockcfg.EnvEtcdIdleLeases: "many", lockcfg.EnvRequestTimeoutMs: "soon",
	}))
	if !errors.Is(err, errInvalidConfig) {
		t.Fatalf("loadConfig error = %v, want errInvalidConfig", err)
	}
	for _, name := range []string{lockcfg.EnvEtcdIdleLeases, lockcfg.EnvRequestTimeoutMs, lockcfg.EnvEtcdEndpoints} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("loadConfig error %q does not name %s", err, name)
		}
	}
}

// TestIdleLeasesZeroMeansOffInBothPlaces: ETCD_IDLE_LEASES=0 and
// etcdstore's IdleLeases 0 mean the same (no pool), and the defaults agree.
func TestIdleLeasesZeroMeansOffInBothPlaces(t *testing.T) {
	c, err := loadConfig(env(map[string]string{lockcfg.EnvStore: "etcd", lockcfg.EnvEtcdEndpoints: "http://a:2379", lockcfg.EnvEtcdIdleLeases: "0"}))
	if err != nil || c.Etcd.IdleLeases != 0 {
		t.Fatalf("ETCD_IDLE_LEASES=0: %+v, %v; want Etcd.IdleLeases 0 (no pool)", c.Etcd, err)
	}
	if got, want := defaultConfig().Etcd.IdleLeases, etcdstore.DefaultConfig().IdleLeases; got != want || want != etcdstore.DefaultIdleLeases {
		t.Errorf("default idle leases: lock-server %d, etcdstore %d; want both %d", got, want, etcdstore.DefaultIdleLeases)
	}
	if got := defaultConfig().LockDB.MaxConns; got != pgstore.DefaultMaxConns {
		t.Errorf("default lockdb pool: lock-server %d, pgstore %d", got, pgstore.DefaultMaxConns)
	}
}

// TestStallProbeTimeoutIsRead: LOCK_STALL_PROBE_TIMEOUT_MS sets the bound
// of the stall probe; unset, it is lock-server's default (1 s, well under
// the callers' 5 s budget).
func TestStallProbeTimeoutIsRead(t *testing.T) {
	c, err := loadConfig(env(map[string]string{lockcfg.EnvLockDBURL: "postgres://x/lockdb", lockcfg.EnvStallProbeTimeoutMs: "750"}))
	if err != nil || c.StallProbeTimeout != 750*time.Millisecond {
		t.Fatalf("LOCK_STALL_PROBE_TIMEOUT_MS=750: %v, %v; want 750ms", c.StallProbeTimeout, err)
	}
	if got := defaultConfig().StallProbeTimeout; got != lockserver.DefaultServerConfig().StallProbeTimeout || got >= lockserver.DefaultServerConfig().RequestTimeout {
		t.Fatalf("default stall probe timeout %v; want lockserver's default, under its RequestTimeout", got)
	}
}

// TestEnvNamesListsEveryVariableLoadConfigReads keeps the list the unknown
// variable warning uses equal to what loadConfig reads.
func TestEnvNamesListsEveryVariableLoadConfigReads(t *testing.T) {
	read := map[string]bool{}
	_, _ = loadConfig(func(k string) string { read[k] = true; return "" })
	names := envNames()
	for k := range read {
		if !slices.Contains(names, k) {
			t.Errorf("loadConfig reads %s, envNames does not list it", k)
		}
	}
	if len(names) != len(read) {
		t.Errorf("envNames = %v, loadConfig reads %v", names, read)
	}
}

// TestMisspeltVariableIsWarnedAboutAtStart runs lock-server's main loop
// with a misspelt variable in its environment and a lockdb that refuses
// connections: before failing to open the store it warns, naming the
// variable and the close known name, and an unknown LOCK_TTL without one.
func TestMisspeltVariableIsWarnedAboutAtStart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // a port nothing listens on: the store cannot open
	vars := map[string]string{lockcfg.EnvLockDBURL: "postgres://u@" + addr + "/lockdb?connect_timeout=2",
		"LOCK_REQEST_TIMEOUT_MS": "50", "LOCK_TTL": "5000", "PATH": "/bin"}
	var environ []string
	for k, v := range vars {
		environ = append(environ, k+"="+v)
	}
	var buf bytes.Buffer
	if err := run(t.Context(), env(vars), environ, &buf, nil); err == nil {
		t.Fatal("run with an unreachable lockdb returned nil")
	}
	out := buf.String()
	for _, want := range []string{
		`"event":"` + envcheck.EventUnknownVariable + `"`, `"variable":"LOCK_REQEST_TIMEOUT_MS"`,
		`"didYouMean":"` + lockcfg.EnvRequestTimeoutMs + `"`, `"variable":"LOCK_TTL"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log %s; want %s", out, want)
		}
	}
	if n := strings.Count(out, envcheck.EventUnknownVariable); n != 2 {
		t.Errorf("%d warnings, want 2: %s", n, out)
	}
}

// TestMisspeltVariableIsWarnedAboutWhenTheConfigIsRefused: a misspelt
// LOCKDB_URL makes the configuration invalid (LOCKDB_URL missing); the
// warning still comes, pointing at the real name.
func TestMisspeltVariableIsWarnedAboutWhenTheConfigIsRefused(t *testing.T) {
	vars := map[string]string{"LOCKDB_ULR": "postgres://u@127.0.0.1:1/lockdb"}
	var buf bytes.Buffer
	err := run(t.Context(), env(vars), []string{"LOCKDB_ULR=" + vars["LOCKDB_ULR"]}, &buf, nil)
	if !errors.Is(err, errInvalidConfig) || !strings.Contains(err.Error(), lockcfg.EnvLockDBURL) {
		t.Fatalf("run = %v; want errInvalidConfig naming %s", err, lockcfg.EnvLockDBURL)
	}
	if out := buf.String(); !strings.Contains(out, `"variable":"LOCKDB_ULR"`) || !strings.Contains(out, `"didYouMean":"`+lockcfg.EnvLockDBURL+`"`) {
		t.Errorf("log %s; want a %s line for LOCKDB_ULR suggesting %s", out, envcheck.EventUnknownVariable, lockcfg.EnvLockDBURL)
	}
}

// TestProofSigningKey: LOCK_PROOF_SIGNING_KEY is optional, parsed when
// set, and a bad value is refused by name without echoing the secret.
func TestProofSigningKey(t *testing.T) {
	secret := fenceprooftest.LockSigningKey().String()
	c, err := loadConfig(env(map[string]string{lockcfg.EnvLockDBURL: "postgres://u@127.0.0.1/lockdb", lockcfg.EnvProofSigningKey: secret}))
	if err != nil || c.ProofKey.ID() != fenceprooftest.LockSigningKey().ID() {
		t.Fatalf("loadConfig with a signing key: %v, key %q", err, c.ProofKey.ID())
	}
	if c, err := loadConfig(env(map[string]string{lockcfg.EnvLockDBURL: "postgres://u@127.0.0.1/lockdb"})); err != nil || !c.ProofKey.IsZero() {
		t.Fatalf("loadConfig without a signing key: %v, key %q; want none", err, c.ProofKey.ID())
	}
	bad := secret[:len(secret)-4] // cut: not a key any more
	_, err = loadConfig(env(map[string]string{lockcfg.EnvLockDBURL: "postgres://u@127.0.0.1/lockdb", lockcfg.EnvProofSigningKey: bad}))
	if !errors.Is(err, errInvalidConfig) || !strings.Contains(err.Error(), lockcfg.EnvProofSigningKey) {
		t.Fatalf("a cut signing key: %v; want errInvalidConfig naming %s", err, lockcfg.EnvProofSigningKey)
	}
	if strings.Contains(err.Error(), bad[len(bad)-20:]) {
		t.Fatalf("the error %q echoes the secret", err)
	}
}
