package pgstore

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgcluster"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/storetest"
)

// startReplica runs one lock-server over lockdb at dsn (its own Store,
// Server and HTTP listener, as one pod of lock-server's Deployment) until
// t ends, and returns its base URL.
func startReplica(t *testing.T, dsn string) string {
	t.Helper()
	h, err := lockserver.NewServer(openStore(t, dsn), lockserver.DefaultServerConfig(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() { srv.Close(); _ = h.Close() })
	return srv.URL
}

// post sends body to url + path and decodes a 200's body into out; it
// returns the status and, for an error, the envelope's code.
func post(t *testing.T, url, path string, body, out any) (int, api.Code) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, url+path, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK && out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		return resp.StatusCode, ""
	}
	var env api.ErrorEnvelope
	_ = json.NewDecoder(resp.Body).Decode(&env)
	return resp.StatusCode, env.Error.Code
}

// grantAndRelease takes key through the lock-server at url and gives it
// back. It returns the token, or 0 and the code of a refusal.
func grantAndRelease(t *testing.T, url, key, owner string) (int64, api.Code) {
	t.Helper()
	for {
		var g api.Grant
		status, code := post(t, url, api.PathLockPrefix+key+"/acquire", api.AcquireRequest{Owner: owner, TTLMs: 30_000}, &g)
		if status != http.StatusOK {
			if code == api.CodeBackendUnavailable { // a replica whose connections died with lockdb: ask again
				continue
			}
			return 0, code
		}
		if status, code := post(t, url, api.PathLockPrefix+key+"/release", api.ReleaseRequest{Owner: owner, Token: g.Token}, nil); status != http.StatusNoContent {
			t.Fatalf("release of %s token %d: %d %s", key, g.Token, status, code)
		}
		return g.Token, ""
	}
}

// TestNoTokenIsIssuedTwiceAfterARollbackOfLockdb takes lockdb back to just
// after a key's first token in each way that keeps its identity, after the
// lock-server that issued the tokens (same) had issued three more, and
// then asks that lock-server, the other replica that ran throughout
// (other) and one started after the rollback (restarted) for the key and
// for a new one: each answer is a token above every token issued before,
// or a refusal (BACKEND_RESTORED), never a token issued again.
//
// The restores step lockdb's clock forward a minute after the rollback:
// restoring a backup takes at least that (the clock floor, migration
// 00005, protects rollbacks more than a second old; docs/correctness.md).
// The sequence reset and the crash are tried with the real clock.
//
// The rows run one after another on one cluster, each on a lockdb of its
// own; the ones that stop, put back or kill the server do it to the whole
// cluster, whose other databases no row uses any more. The cluster runs
// with the crash row's settings from the start: commits acknowledged
// before they are on disk, and a WAL writer that flushes them only every
// ten seconds. The other rows stop the server cleanly or not at all, so
// what reached the server stays, and the store's own sessions commit
// synchronously whatever the server's default
// (TestCommitsAreDurableWhateverTheServerSays).
func TestNoTokenIsIssuedTwiceAfterARollbackOfLockdb(t *testing.T) {
	c := pgtest.NewClusterWith(t, map[string]string{"synchronous_commit": "off", "wal_writer_delay": "10s", "checkpoint_timeout": "1h"})
	rows := []struct {
		name string
		// backup runs after the first token; rollback after the others.
		backup   func(t *testing.T, c *pgcluster.Cluster, dsn string) string
		rollback func(t *testing.T, c *pgcluster.Cluster, dsn, backup string)
		step     time.Duration
	}{
		{name: "DataOnlyDumpRestoredInPlace", step: time.Minute,
			backup: func(t *testing.T, c *pgcluster.Cluster, dsn string) string {
				dump := filepath.Join(t.TempDir(), "lockdb.sql")
				pgtest.RunTool(t, "pg_dump", "--data-only", "--file="+dump, "--dbname="+dsn)
				return dump
			},
			rollback: func(t *testing.T, c *pgcluster.Cluster, dsn, dump string) {
				execSQL(t, dsn, `TRUNCATE lock_lease, lockdb_identity, pgstore_goose_version`)
				pgtest.RunTool(t, "psql", "--quiet", "--set=ON_ERROR_STOP=1", "--file="+dump, "--dbname="+dsn)
			}},
		{name: "SequenceRestarted",
			backup: func(*testing.T, *pgcluster.Cluster, string) string { return "" },
			rollback: func(t *testing.T, c *pgcluster.Cluster, dsn, _ string) {
				execSQL(t, dsn, `ALTER SEQUENCE fencing_token_seq RESTART WITH 2`)
			}},
		{name: "DataDirectoryPutBack", step: time.Minute,
			backup: func(t *testing.T, c *pgcluster.Cluster, dsn string) string {
				if err := c.Stop(testCtx(t)); err != nil {
					t.Fatal(err)
				}
				copyDir(t, filepath.Join(c.Dir(), "data"), filepath.Join(c.Dir(), "snapshot"))
				if err := c.Start(testCtx(t)); err != nil {
					t.Fatal(err)
				}
				return filepath.Join(c.Dir(), "snapshot")
			},
			rollback: func(t *testing.T, c *pgcluster.Cluster, dsn, snapshot string) {
				if err := c.Stop(testCtx(t)); err != nil {
					t.Fatal(err)
				}
				data := filepath.Join(c.Dir(), "data")
				if err := os.RemoveAll(data); err != nil {
					t.Fatal(err)
				}
				copyDir(t, snapshot, data)
				if err := c.Start(testCtx(t)); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "CrashWithAsynchronousCommit",
			backup: func(*testing.T, *pgcluster.Cluster, string) string { return "" },
			rollback: func(t *testing.T, c *pgcluster.Cluster, dsn, _ string) {
				if err := c.Kill(); err != nil { // SIGKILL of the postmaster and its children
					t.Fatal(err)
				}
				if err := c.Start(testCtx(t)); err != nil {
					t.Fatal(err)
				}
			}},
	}
	for i, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			db := fmt.Sprintf("lockdb_%d", i)
			if err := c.CreateDatabase(testCtx(t), db); err != nil {
				t.Fatal(err)
			}
			dsn := c.DSN(db)
			same, other := startReplica(t, dsn), startReplica(t, dsn)
			const key = "payout:acct-1"
			first, code := grantAndRelease(t, same, key, "worker-a")
			if code != "" {
				t.Fatalf("first grant: %s", code)
			}
			backup := row.backup(t, c, dsn)
			var highest int64
			for range 3 {
				tok, code := grantAndRelease(t, same, key, "worker-a")
				if code != "" || tok <= highest || tok <= first {
					t.Fatalf("grant before the rollback: token %d %s", tok, code)
				}
				highest = tok
			}
			row.rollback(t, c, dsn, backup)
			if row.step > 0 {
				stepClock(t, dsn, row.step)
			}
			restarted := startReplica(t, dsn)
			for _, ls := range []struct{ name, url string }{{"same", same}, {"other", other}, {"restarted", restarted}} {
				for _, k := range []string{key, "payout:new-" + ls.name} {
					tok, code := grantAndRelease(t, ls.url, k, "worker-b")
					switch {
					case code == api.CodeBackendRestored:
						t.Logf("%s lock-server, key %s: refused %s", ls.name, k, code)
					case code != "":
						t.Errorf("%s lock-server, key %s: %s; want a token above %d or BACKEND_RESTORED", ls.name, k, code, highest)
					case tok <= highest:
						t.Errorf("%s lock-server granted key %s token %d after the rollback; tokens up to %d had been issued", ls.name, k, tok, highest)
					default:
						t.Logf("%s lock-server, key %s: token %d (above %d)", ls.name, k, tok, highest)
					}
				}
			}
		})
	}
}

// TestADrawNotAboveTheKeysRowIsRefused: a sequence taken back by less
// than the clock floor notices (a second) still cannot give a key a token
// at or below the one its row holds: the granting statement refuses it as
// a restore, and grants nothing. (Each refused draw moves the sequence on,
// so a later draw passes once it is above the row.)
func TestADrawNotAboveTheKeysRowIsRefused(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s := openStore(t, dsn)
	last := grantRelease(t, s, "payout:acct-1", 3)
	for name, grant := range map[string]func() error{
		"Acquire": func() error { _, err := s.Acquire(testCtx(t), "payout:acct-1", "worker-b", testTTL); return err },
		"AcquireMany": func() error {
			return s.AcquireMany(testCtx(t), []store.AcquireRequest{{Key: "payout:acct-1", Owner: "worker-b", TTL: testTTL}})[0].Err
		},
	} {
		// Each refused statement still used up its draws: restart each time.
		execSQL(t, dsn, fmt.Sprintf(`ALTER SEQUENCE fencing_token_seq RESTART WITH %d`, last-1))
		if err := grant(); !errors.Is(err, store.ErrBackendRestored) {
			t.Errorf("%s with the sequence below the key's row: %v; want ErrBackendRestored", name, err)
		}
	}
	if st, err := s.Inspect(testCtx(t), "payout:acct-1"); err != nil || st.Lease != nil || st.LastToken != last {
		t.Fatalf("after the refusals: %+v, last token %d, %v; want free with last token %d", st.Lease, st.LastToken, err, last)
	}
}

// TestTokensFollowLockdbsClock: the first token of a new lockdb is at
// least lockdb's clock in microseconds; a clock stepped forward moves the
// next token up with it, and one stepped back moves nothing down.
func TestTokensFollowLockdbsClock(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s := openStore(t, dsn)
	before := time.Now().Add(-time.Second).UnixMicro() // the two clocks are the same host's here
	first := grantRelease(t, s, "payout:acct-1", 1)
	if first < before {
		t.Fatalf("first token %d; want at least the clock floor %d", first, before)
	}
	stepClock(t, dsn, time.Hour)
	ahead := grantRelease(t, s, "payout:acct-1", 1)
	if ahead < first+time.Hour.Microseconds() {
		t.Fatalf("after a step of an hour: token %d; want at least %d", ahead, first+time.Hour.Microseconds())
	}
	stepClock(t, dsn, -2*time.Hour)
	if back := grantRelease(t, s, "payout:acct-1", 1); back <= ahead {
		t.Fatalf("after a step back: token %d; want above %d", back, ahead)
	}
}

// TestAClockPastTheTokenRangeGrantsNothing: a clock read beyond 2^53 - 1
// microseconds cannot become a token; the grant fails and draws nothing.
func TestAClockPastTheTokenRangeGrantsNothing(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s := openStore(t, dsn)
	stepClock(t, dsn, 250*365*24*time.Hour)
	if l, err := s.Acquire(testCtx(t), "payout:acct-1", "worker-a", testTTL); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Acquire with lockdb's clock 250 years ahead: token %d, %v; want ErrUnavailable", l.Token, err)
	}
}

// TestCommitsAreDurableWhateverTheServerSays: a server that acknowledges
// commits before they are flushed (synchronous_commit off) does not for
// the store's own sessions; a server with fsync off is refused at Open.
func TestCommitsAreDurableWhateverTheServerSays(t *testing.T) {
	t.Run("SynchronousCommitOff", func(t *testing.T) {
		c := pgtest.NewClusterWith(t, map[string]string{"synchronous_commit": "off"})
		s := openStore(t, c.AdminDSN())
		var got string
		if err := s.pool.QueryRow(testCtx(t), `SHOW synchronous_commit`).Scan(&got); err != nil || got != "on" {
			t.Fatalf("the store's session: synchronous_commit %q, %v; want on", got, err)
		}
	})
	t.Run("FsyncOff", func(t *testing.T) {
		c := pgtest.NewClusterWith(t, map[string]string{"fsync": "off"})
		s, err := Open(testCtx(t), conf(func(cfg *Config) { cfg.DSN = c.AdminDSN() }), nil)
		if err == nil {
			_ = s.Close()
			t.Fatal("Open succeeded on a server with fsync off")
		}
		if !errors.Is(err, ErrNotDurable) {
			t.Fatalf("Open with fsync off: %v; want ErrNotDurable", err)
		}
	})
}

func execSQL(t *testing.T, dsn, sql string) {
	t.Helper()
	conn, err := pgx.Connect(testCtx(t), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(testCtx(t))
	if _, err := conn.Exec(testCtx(t), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// copyDir copies a stopped cluster's data directory, keeping owners and
// modes, as a disk snapshot would.
func copyDir(t *testing.T, from, to string) {
	t.Helper()
	if out, err := exec.Command("cp", "-a", from, to).CombinedOutput(); err != nil {
		t.Fatalf("cp -a %s %s: %v: %s", from, to, err, out)
	}
}

// TestLinearizableAcrossReplicasWhileTheSequenceGoesBack runs the
// linearizability workload through two replicas and, under the clients,
// restarts one of them and resets fencing_token_seq to 2 (rows intact);
// grants are refused (BACKEND_RESTORED) until the operator's advance past
// the largest token in lockdb. The history must stay linearizable, every
// grant above all before it.
func TestLinearizableAcrossReplicasWhileTheSequenceGoesBack(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	first, second := openStore(t, dsn), openStore(t, dsn)
	storetest.CheckLinearizableAcrossReplicas(t, "postgres/sequence-reset", first, second, func(old store.LockStore) store.LockStore {
		_ = old.Close()
		conn, err := pgx.Connect(testCtx(t), dsn)
		if err != nil {
			t.Error(err)
			return old
		}
		defer conn.Close(testCtx(t))
		if _, err := conn.Exec(testCtx(t), `ALTER SEQUENCE fencing_token_seq RESTART WITH 2`); err != nil {
			t.Error(err)
		}
		s, err := Open(testCtx(t), conf(func(c *Config) { c.DSN = dsn }), nil)
		if err != nil {
			t.Error(err)
			return old
		}
		t.Cleanup(func() { _ = s.Close() })
		var highest int64
		if err := conn.QueryRow(testCtx(t), `SELECT max(fencing_token) FROM lock_lease`).Scan(&highest); err != nil {
			t.Error(err)
		} else if _, err := s.Advance(testCtx(t), highest); err != nil {
			t.Error(err)
		}
		return s
	})
}
