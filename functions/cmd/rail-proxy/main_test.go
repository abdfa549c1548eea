package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const journalJSON = `{"submissions":[{"seq":1,"request":{"payoutId":"p-1","accountId":"a-1","amountMinor":5,"currency":"EUR","reference":"p-1"},"answer":{"status":"ACK","railRef":"rail-000001"}}]}`

// newRaildb returns the DSN of a fresh raildb, migrated by a Proxy.
func newRaildb(t *testing.T) string {
	t.Helper()
	dsn := pgtest.NewDatabase(t)
	cfg := railproxy.DefaultConfig()
	cfg.DB.DSN, cfg.RailURL = dsn, "http://127.0.0.1:1"
	cfg.ProofKeys, cfg.ReceiptKey = fencingtest.ProofKeys(), fencingtest.ReceiptSigningKey()
	cfg.TermsKeys = fencingtest.TermsKeys()
	p, err := railproxy.New(t.Context(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Close()
	return dsn
}

func run(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := recoverRestore(context.Background(), args, func(k string) string { return env[k] }, &out, &errOut)
	return code, out.String(), errOut.String()
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "journal.json")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestRecoverRestoreCommand(t *testing.T) {
	dsn := newRaildb(t)
	env := map[string]string{railapi.EnvDatabaseURL: dsn}
	code, out, errOut := run(t, env, "--past", "77", "--rail-journal", writeFile(t, journalJSON))
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, errOut)
	}
	var rec railproxy.RestoreRecovered
	if err := json.Unmarshal([]byte(out), &rec); err != nil || rec.TokenFloor != 77 || len(rec.Rebuilt) != 1 || rec.Rebuilt[0].PayoutID != "p-1" {
		t.Fatalf("stdout %s (%v); want floor 77 and p-1 rebuilt", out, err)
	}
	if !strings.Contains(errOut, `"event":"raildb_recovered"`) {
		t.Errorf("stderr %s; want the raildb_recovered event", errOut)
	}
}

// Bad arguments and unreadable input exit 2 with a clear message, before
// raildb is touched.
func TestRecoverRestoreCommandBadInputChangesNothing(t *testing.T) {
	dsn := newRaildb(t)
	env := map[string]string{railapi.EnvDatabaseURL: dsn}
	good := writeFile(t, journalJSON)
	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"past-zero", env, []string{"--past", "0", "--rail-journal", good}, "--past 0"},
		{"past-missing", env, []string{"--rail-journal", good}, "--past 0"},
		{"past-not-a-number", env, []string{"--past", "x", "--rail-journal", good}, "invalid value"},
		{"journal-missing", env, []string{"--past", "5"}, "--rail-journal is required"},
		{"journal-unreadable", env, []string{"--past", "5", "--rail-journal", filepath.Join(t.TempDir(), "absent.json")}, "no such file"},
		{"journal-not-json", env, []string{"--past", "5", "--rail-journal", writeFile(t, "not json")}, "rail journal"},
		{"no-raildb-url", map[string]string{}, []string{"--past", "5", "--rail-journal", good}, railapi.EnvDatabaseURL + " is required"},
		{"stray-argument", env, []string{"--past", "5", "--rail-journal", good, "now"}, "unexpected arguments"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out, errOut := run(t, c.env, c.args...)
			if code != 2 || out != "" || !strings.Contains(errOut, c.want) {
				t.Errorf("exit %d, stdout %q, stderr %q; want 2 and %q", code, out, errOut, c.want)
			}
		})
	}
	pool, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var floor, attempts int64
	if err := pool.QueryRow(t.Context(), `SELECT token_floor, (SELECT count(*) FROM rail_attempt) FROM raildb_identity`).Scan(&floor, &attempts); err != nil {
		t.Fatal(err)
	}
	if floor != 0 || attempts != 0 {
		t.Errorf("raildb changed: floor %d, %d attempts; want 0 and 0", floor, attempts)
	}
}
