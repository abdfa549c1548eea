package pgtest

import (
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/jackc/pgx/v5"
)

// The shared cluster's waiter and the interrupt handler end with the
// tests (Tests leaves no goroutine behind).
func TestMain(m *testing.M) { goleak.VerifyTestMain(Tests(m)) }

func TestNewDatabaseIsFreshAndUnique(t *testing.T) {
	a, b := NewDatabase(t), NewDatabase(t)
	if a == b {
		t.Fatalf("two NewDatabase calls returned the same DSN %q", a)
	}
	for _, dsn := range []string{a, b} {
		conn, err := pgx.Connect(t.Context(), dsn)
		if err != nil {
			t.Fatalf("connect %s: %v", dsn, err)
		}
		var tables int
		err = conn.QueryRow(t.Context(), "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").Scan(&tables)
		conn.Close(context.Background())
		if err != nil || tables != 0 {
			t.Fatalf("%s: %d public tables, err %v; want an empty database", dsn, tables, err)
		}
	}
}

func TestDBName(t *testing.T) {
	long := "TestSomething/with a very long subtest name that goes on and on and on"
	got := dbName(long)
	if len(got) > 63 || !strings.HasPrefix(got, "t_testsomething_with_a_") {
		t.Fatalf("dbName(%q) = %q; want a t_-prefixed sanitized name of at most 63 bytes", long, got)
	}
	if dbName(long) == got {
		t.Fatalf("dbName returned %q twice", got)
	}
}
