package lockserver_test

import (
	"log/slog"
	"testing"

	"go.uber.org/goleak"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// The Server starts no goroutine of its own but the releases of abandoned
// grants, which end within RequestTimeout (Server.Close waits for them);
// requests it held (the overload tests) must all have ended.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serverWith is lockserver.NewServer with logs discarded; a configuration
// it refuses fails the test.
func serverWith(t testing.TB, store store.LockStore, cfg lockserver.ServerConfig) *lockserver.Server {
	t.Helper()
	h, err := lockserver.NewServer(store, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return h
}
