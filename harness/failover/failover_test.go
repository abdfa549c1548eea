package failover

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgcluster"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/servertest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/pgstore"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/storetest"
)

// syncedBuffer is a log sink safe for the experiment's goroutines.
type syncedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncedBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncedBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The short version of `make failover`: with a synchronous standby, killing
// lockdb's primary under load is a measured dip and a recovery through the
// same lock-server, without a safety event, and paydb is untouched.
func TestSyncFailoverDipsAndRecoversWithoutSafetyEvent(t *testing.T) {
	t.Parallel()
	var logs, serverLogs syncedBuffer
	cfg := DefaultConfig()
	cfg.Seed, cfg.Clients = 20261201, 4
	cfg.Before, cfg.PromoteDelay, cfg.After = 1500*time.Millisecond, 300*time.Millisecond, 2*time.Second
	cfg.Log = slog.New(slog.NewJSONHandler(&logs, nil))
	cfg.ServerLog = slog.New(slog.NewJSONHandler(&serverLogs, nil))
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("Run: %v\nviolations: %v", err, rep.Violations)
	}
	t.Logf("seed %d: %d acquires, %d grants; promoted +%d ms; dip: first failure +%d ms, last +%d ms, recovered +%d ms, slowest %d ms, %d of %d failed",
		rep.Seed, rep.Attempts, rep.Grants, rep.PromotedMs-rep.KillMs, rep.Dip.FirstFailureMs, rep.Dip.LastFailureMs, rep.Dip.RecoveredMs,
		rep.Dip.SlowestMs, rep.Dip.Failed, rep.Dip.Attempts)
	if rep.Dip.Failed == 0 && rep.Dip.SlowestMs < cfg.PromoteDelay.Milliseconds() {
		t.Errorf("no dip measured: no acquire failed and none waited %v after the kill", cfg.PromoteDelay)
	}
	if rep.Dip.RecoveredMs < 0 || rep.LowestAfterPromotion == 0 {
		t.Fatalf("no recovery: recovered %d ms, lowest token after promotion %d", rep.Dip.RecoveredMs, rep.LowestAfterPromotion)
	}
	// /readyz follows the backend: not ready in the gap, ready again after.
	if rep.ReadyzDownMs < 0 || rep.ReadyzUpMs < rep.ReadyzDownMs {
		t.Errorf("readyz went down at +%d ms and up at +%d ms; want down in the gap, then up", rep.ReadyzDownMs, rep.ReadyzUpMs)
	}
	if rep.LowestAfterPromotion <= rep.HighestBeforeKill {
		t.Errorf("token %d after promotion, %d before the kill", rep.LowestAfterPromotion, rep.HighestBeforeKill)
	}
	if rep.PaydbBefore != rep.PaydbAfter || rep.PaydbBefore.Rows != int64(cfg.PaydbRows) {
		t.Errorf("paydb before %+v, after %+v", rep.PaydbBefore, rep.PaydbAfter)
	}
	for _, ev := range []string{EventStarted, EventPrimaryKilled, EventStandbyPromoted, EventDip, EventSafety} {
		if !strings.Contains(logs.String(), `"event":"`+ev+`"`) {
			t.Errorf("no %s line in the experiment's log", ev)
		}
	}
	if !strings.Contains(serverLogs.String(), `"event":"`+pgstore.EventPromotionAccepted+`"`) {
		t.Errorf("lock-server logged no %s", pgstore.EventPromotionAccepted)
	}
}

// Check finds each kind of violation in a history made up to contain it,
// and none in a clean one.
func TestCheckFindsEachViolation(t *testing.T) {
	clean := func() Report {
		return Report{KillMs: 1000, PromotedMs: 1500, Grantlist: []Grant{
			{Key: "k1", Owner: "a", Token: 10, SentMs: 100, GrantMs: 110, ReleaseMs: 120},
			{Key: "k1", Owner: "b", Token: 12, SentMs: 300, GrantMs: 310, ReleaseMs: 320},
			{Key: "k1", Owner: "a", Token: 50, SentMs: 1600, GrantMs: 1610, ReleaseMs: 1620},
		}}
	}
	rep := clean()
	Check(&rep)
	if len(rep.Violations) != 0 {
		t.Fatalf("clean history: %v", rep.Violations)
	}
	for name, tc := range map[string]struct {
		change func(*Report)
		want   string
	}{
		"repeat": {func(r *Report) {
			r.Grantlist = append(r.Grantlist, Grant{Key: "k2", Owner: "c", Token: 50, SentMs: 1700, GrantMs: 1710, ReleaseMs: 1720})
		}, "granted twice"},
		"regression": {func(r *Report) { r.Grantlist[2].Token = 11 }, "INV-02"},
		"overlap": {func(r *Report) {
			r.Grantlist = append(r.Grantlist, Grant{Key: "k1", Owner: "c", Token: 49, SentMs: 1611, GrantMs: 1612, ReleaseMs: 1630})
		}, "held from"},
		"paydb": {func(r *Report) { r.PaydbAfter.Rows = 1 }, "paydb changed"},
	} {
		rep := clean()
		tc.change(&rep)
		Check(&rep)
		if len(rep.Violations) == 0 || !strings.Contains(strings.Join(rep.Violations, "\n"), tc.want) {
			t.Errorf("%s: violations %v; want one saying %q", name, rep.Violations, tc.want)
		}
	}
	rep = clean()
	rep.SequenceAfterPromotion = 10
	Check(&rep)
	if rep.RepeatableTokens != 1 || rep.HighestBeforeKill != 12 {
		t.Errorf("repeatable %d, highest %d; want 1 (token 12 above sequence 10), 12", rep.RepeatableTokens, rep.HighestBeforeKill)
	}
}

func TestMeasureDip(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	var rep Report
	measure(&rep, []attempt{
		{Sent: ms(10), Answered: ms(20), Outcome: outGranted},
		{Sent: ms(990), Answered: ms(1050), Outcome: outUnavail},  // first failure, +50
		{Sent: ms(1100), Answered: ms(1150), Outcome: outHeld},    // served
		{Sent: ms(1200), Answered: ms(1400), Outcome: outUnavail}, // last failure, +400
		{Sent: ms(1300), Answered: ms(1900), Outcome: outGranted}, // recovered, +900, slowest 600
		{Sent: ms(1950), Answered: ms(1960), Outcome: outGranted},
	}, ms(1000), ms(2000), ms(100))
	d := rep.Dip
	if d.FirstFailureMs != 50 || d.LastFailureMs != 400 || d.RecoveredMs != 900 || d.SlowestMs != 600 || d.Attempts != 4 || d.Failed != 2 || d.FailedPct != 50 {
		t.Fatalf("dip %+v", d)
	}
	if rep.Grants != 3 || len(rep.Windows) != 21 || rep.Windows[10].Failed != 1 || rep.Windows[14].Failed != 1 {
		t.Fatalf("grants %d, windows %v", rep.Grants, rep.Windows)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	cfg := DefaultConfig()
	cfg.Mode, cfg.Clients, cfg.Window, cfg.StandbyStall = "semi", 0, 0, -time.Second
	err := cfg.Validate()
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Validate = %v; want ErrInvalidConfig", err)
	}
	for _, want := range []string{"mode", "clients", "window", "standby stall"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v does not name %s", err, want)
		}
	}
}

// The contract suite's linearizability check (porcupine, the LockStore's
// sequential lock) over HTTP and the SDK, while lockdb's synchronous
// primary is killed and its standby promoted under the clients: nothing
// acknowledged is lost, and every answer fits one correct lock.
func TestLinearizableAcrossSyncFailover(t *testing.T) {
	t.Parallel()
	b := servertest.OverHTTP(storetest.Backend{
		Name: "postgres-failover",
		RestartBackend: func(t *testing.T) (store.LockStore, func()) {
			ctx := t.Context()
			primary, err := pgcluster.Start(ctx, pgcluster.Config{})
			if err != nil {
				t.Fatalf("start primary: %v", err)
			}
			t.Cleanup(func() { _ = primary.Close() })
			if err := primary.CreateDatabase(ctx, "lockdb"); err != nil {
				t.Fatal(err)
			}
			if err := pgstore.Migrate(ctx, primary.DSN("lockdb")); err != nil {
				t.Fatal(err)
			}
			standby, err := primary.StartStandby(ctx, pgcluster.StandbyConfig{Name: "standby1"})
			if err != nil {
				t.Fatalf("start standby: %v", err)
			}
			t.Cleanup(func() { _ = standby.Close() })
			if err := primary.SetSynchronousStandby(ctx, "standby1"); err != nil {
				t.Fatal(err)
			}
			cfg := pgstore.DefaultConfig()
			cfg.DSN, cfg.AcceptPromotion, cfg.ConnectTimeout = pgcluster.MultiHostDSN("lockdb", primary, standby), true, time.Second
			s, err := pgstore.Open(ctx, cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			return s, func() {
				if err := primary.Kill(); err != nil {
					t.Errorf("kill primary: %v", err)
					return
				}
				if err := standby.Promote(context.Background()); err != nil {
					t.Errorf("promote: %v", err)
				}
			}
		},
	})
	s, failover := b.RestartBackend(t)
	t.Cleanup(func() { _ = s.Close() })
	storetest.CheckLinearizable(t, b.Name, s, failover)
}
