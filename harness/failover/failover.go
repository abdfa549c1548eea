// Package failover is the lockdb failover experiment (SC-08): lockdb as a
// primary with a streaming standby, clients acquiring through a lock-server
// in this process, the primary killed and the standby promoted (Run); it
// measures the dip in acquire availability and checks that no token was
// granted twice or went back (Check). Run it with `make failover` or
// ./harness/cmd/failover; docs/reliability.md has the design and results.
package failover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgcluster"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/pgstore"
)

// Replication modes of Config.Mode.
const (
	// ModeSync: the primary's commits wait for the standby
	// (synchronous_standby_names), and lock-server accepts the promotion.
	ModeSync = "sync"
	// ModeAsync: commits do not wait; lock-server is told to accept
	// promotions all the same, and refuses (it saw the replication
	// asynchronous), so the experiment reads the promoted lockdb's sequence
	// directly to show what it would have issued.
	ModeAsync = "async"
)

// Log events of the experiment (the "event" attribute).
const (
	// EventStarted (INFO): the clusters and lock-server are up; the seed.
	EventStarted = "failover_started"
	// EventPrimaryKilled (WARN): lockdb's primary was sent SIGKILL.
	EventPrimaryKilled = "failover_primary_killed"
	// EventStandbyStalled (WARN): the primary's WAL senders were stopped
	// (Config.StandbyStall).
	EventStandbyStalled = "failover_standby_stalled"
	// EventStandbyPromoted (WARN): the standby accepts writes.
	EventStandbyPromoted = "failover_standby_promoted"
	// EventDip (INFO): the measured dip and recovery.
	EventDip = "failover_acquire_dip"
	// EventSafety (INFO when clean, ERROR per violation): the checks.
	EventSafety = "failover_safety"
)

// Defaults of Config.
const (
	DefaultClients      = 8
	DefaultKeys         = 4
	DefaultTTL          = 2 * time.Second
	DefaultBefore       = 3 * time.Second
	DefaultPromoteDelay = 500 * time.Millisecond
	DefaultAfter        = 4 * time.Second
	DefaultWindow       = 100 * time.Millisecond
	DefaultPaydbRows    = 200
)

// Errors of this package; test them with errors.Is.
var (
	// ErrInvalidConfig: a Config field is out of range.
	ErrInvalidConfig = errors.New("failover: invalid config")
	// ErrUnsafe: Check found a safety violation (the Report lists them).
	ErrUnsafe = errors.New("failover: safety violation")
)

// Config describes one run. Start from DefaultConfig.
type Config struct {
	// Mode is ModeSync or ModeAsync.
	Mode string
	// Seed drives the clients' choices.
	Seed uint64
	// Clients is the number of SDK clients, 1..256; Keys the number of
	// lock keys they share, 1..1000.
	Clients, Keys int
	// TTL of every grant (ms precision, at least 100 ms).
	TTL time.Duration
	// Before is the load before the kill; PromoteDelay the time from the
	// kill to the promotion (the failure detection); After the load after
	// the promotion. Each positive.
	Before, PromoteDelay, After time.Duration
	// Window is the width of an availability window (positive).
	Window time.Duration
	// StandbyStall, when positive, stops the primary's WAL senders
	// (pgcluster.PauseWALSenders) that long before the kill: a standby that
	// lags, as one across a congested link between zones does. (Freezing
	// the standby instead does not do it: the kernel's socket buffers
	// hold seconds of WAL, which the standby reads when it resumes.) With synchronous replication commits wait during
	// the stall (the dip starts before the kill); with asynchronous
	// replication they go on, and are lost with the primary.
	StandbyStall time.Duration
	// PaydbRows is the number of rows written to paydb before the run.
	PaydbRows int
	// Log receives the experiment's events; nil discards them.
	Log *slog.Logger
	// ServerLog receives lock-server's and pgstore's events; nil discards.
	ServerLog *slog.Logger
}

// DefaultConfig returns the defaults: synchronous mode, seed 1.
func DefaultConfig() Config {
	return Config{Mode: ModeSync, Seed: 1, Clients: DefaultClients, Keys: DefaultKeys, TTL: DefaultTTL,
		Before: DefaultBefore, PromoteDelay: DefaultPromoteDelay, After: DefaultAfter, Window: DefaultWindow, PaydbRows: DefaultPaydbRows}
}

// Validate returns nil or every invalid field, joined, each wrapping
// ErrInvalidConfig.
func (c Config) Validate() error {
	var errs []error
	bad := func(f string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+f, append([]any{ErrInvalidConfig}, a...)...))
	}
	if c.Mode != ModeSync && c.Mode != ModeAsync {
		bad("mode %q: want %s or %s", c.Mode, ModeSync, ModeAsync)
	}
	if c.Clients < 1 || c.Clients > 256 {
		bad("clients %d: want 1..256", c.Clients)
	}
	if c.Keys < 1 || c.Keys > 1000 {
		bad("keys %d: want 1..1000", c.Keys)
	}
	if c.TTL < 100*time.Millisecond {
		bad("ttl %v: want at least 100ms", c.TTL)
	}
	for name, d := range map[string]time.Duration{"before": c.Before, "promote delay": c.PromoteDelay, "after": c.After, "window": c.Window} {
		if d <= 0 {
			bad("%s %v: want a positive duration", name, d)
		}
	}
	if c.StandbyStall < 0 {
		bad("standby stall %v: want 0 (none) or a positive duration", c.StandbyStall)
	}
	if c.PaydbRows < 1 {
		bad("paydb rows %d: want at least 1", c.PaydbRows)
	}
	return errors.Join(errs...)
}

// Outcomes of an acquire attempt.
const (
	outGranted  = "granted"
	outHeld     = "held"
	outUnavail  = "unavailable"
	outRestored = "restored"
	outOther    = "other"
)

// attempt is one acquire: when it was sent and answered (since the start)
// and how.
type attempt struct {
	Sent, Answered time.Duration
	Outcome        string
}

// Grant is one acquire answered with a lease.
type Grant struct {
	Key       string `json:"key"`
	Owner     string `json:"owner"`
	Token     int64  `json:"token"`
	SentMs    int64  `json:"sentMs"`
	GrantMs   int64  `json:"grantedMs"`
	ReleaseMs int64  `json:"releasedMs"` // when the holder stopped (release sent, or deadline)
	// Accepted: the in-memory fence accepted the holder's write.
	Accepted bool `json:"accepted"`
}

// Window is one availability window.
type Window struct {
	StartMs  int64 `json:"startMs"`
	Attempts int   `json:"attempts"`
	Failed   int   `json:"failed"`
}

// Dip is the measured unavailability around the failover, in ms since the
// kill.
type Dip struct {
	// FirstFailureMs and LastFailureMs are when the first and the last
	// failed acquire after the kill were answered (-1: none failed).
	FirstFailureMs int64 `json:"firstFailureMs"`
	LastFailureMs  int64 `json:"lastFailureMs"`
	// RecoveredMs is when the first grant answered after the last failure
	// (and after the kill) was answered: acquires succeed again. -1 when no
	// grant followed.
	RecoveredMs int64 `json:"recoveredMs"`
	// SlowestMs is the longest an acquire answered after the kill took
	// (sent to answered): requests waiting through the gap count here,
	// not as failures.
	SlowestMs   int64   `json:"slowestMs"`
	Attempts    int     `json:"attempts"` // answered from the kill to RecoveredMs (or the end)
	Failed      int     `json:"failed"`
	FailedPct   float64 `json:"failedPct"`
	Unavailable int     `json:"unavailable"` // of Failed: BACKEND_UNAVAILABLE or transport
	Restored    int     `json:"restored"`    // of Failed: BACKEND_RESTORED
}

// Paydb is what the experiment reads of paydb before and after.
type Paydb struct {
	Rows int64 `json:"rows"`
	// Digest is md5 of every row, in key order.
	Digest string `json:"digest"`
	// NextXID is the next transaction id the server will assign: any
	// transaction that writes takes one. (The WAL position is not used: it
	// moved by a few KB during runs in which nothing wrote paydb.)
	NextXID   int64     `json:"nextXid"`
	StartedAt time.Time `json:"postmasterStartedAt"`
}

// Report is one run's figures and verdicts.
type Report struct {
	Mode           string   `json:"mode"`
	StandbyStallMs int64    `json:"standbyStallMs"`
	Seed           uint64   `json:"seed"`
	Clients        int      `json:"clients"`
	Keys           int      `json:"keys"`
	KillMs         int64    `json:"killMs"`
	PromotedMs     int64    `json:"promotedMs"`
	EndMs          int64    `json:"endMs"`
	Attempts       int      `json:"attempts"`
	Grants         int      `json:"grants"`
	Dip            Dip      `json:"dip"`
	Windows        []Window `json:"windows"`
	// HighestBeforeKill is the largest token granted (answered) before the
	// kill; LowestAfterPromotion the smallest granted after the promotion
	// (0: none).
	HighestBeforeKill    int64 `json:"highestTokenBeforeKill"`
	LowestAfterPromotion int64 `json:"lowestTokenAfterPromotion"`
	// SequenceAfterPromotion is fencing_token_seq's last_value on the
	// promoted lockdb, read directly right after the promotion (in the
	// synchronous mode grants may already have drawn from it, which can
	// only raise it; in the asynchronous mode the restore guard refuses
	// grants before they draw); the next nextval returns one more. RepeatableTokens counts tokens granted
	// before the kill that are above it: the promoted lockdb would issue
	// each again, were nothing to stop it.
	SequenceAfterPromotion int64 `json:"sequenceAfterPromotion"`
	// ReadyzDownMs and ReadyzUpMs are, in ms since the kill, the first
	// /readyz probe (every 50 ms) that answered not ready after the kill,
	// and the first that answered ready after that (-1: none).
	ReadyzDownMs            int64 `json:"readyzDownMs"`
	ReadyzUpMs              int64 `json:"readyzUpMs"`
	RepeatableTokens        int   `json:"repeatableTokens"`
	PaydbBefore, PaydbAfter Paydb
	// Violations are the safety checks that failed (empty: none).
	Violations []string `json:"violations"`
	Grantlist  []Grant  `json:"-"`
}

// fence is an in-memory fence point, strict like rail-proxy's: it accepts
// a write with a token above the key's high-water mark.
type fence struct {
	mu sync.Mutex
	hw map[string]int64
}

func (f *fence) write(key string, token int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if token <= f.hw[key] {
		return false
	}
	f.hw[key] = token
	return true
}

// Run runs the experiment and returns its Report, checked (Check); the
// error wraps ErrUnsafe when a check failed (the Report is returned too),
// ErrInvalidConfig, or a failure to start a part.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	logger := cfg.Log
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	serverLog := cfg.ServerLog
	if serverLog == nil {
		serverLog = slog.New(slog.DiscardHandler)
	}
	rep := Report{Mode: cfg.Mode, StandbyStallMs: cfg.StandbyStall.Milliseconds(), Seed: cfg.Seed, Clients: cfg.Clients, Keys: cfg.Keys}

	// paydb: a cluster of its own that nothing touches during the run.
	// wal_level minimal: no standby snapshots move its WAL while idle.
	// autovacuum off: its visits to the catalogs that CREATE DATABASE and
	// CREATE TABLE changed wrote WAL during one early run, which is not
	// the experiment touching paydb.
	paydb, err := pgcluster.Start(ctx, pgcluster.Config{Settings: map[string]string{"wal_level": "minimal", "max_wal_senders": "0", "autovacuum": "off"}})
	if err != nil {
		return rep, fmt.Errorf("failover: start paydb: %w", err)
	}
	defer paydb.Close()
	if err := seedPaydb(ctx, paydb, cfg.PaydbRows); err != nil {
		return rep, err
	}

	primary, err := pgcluster.Start(ctx, pgcluster.Config{})
	if err != nil {
		return rep, fmt.Errorf("failover: start lockdb primary: %w", err)
	}
	defer primary.Close()
	if err := primary.CreateDatabase(ctx, "lockdb"); err != nil {
		return rep, err
	}
	if err := pgstore.Migrate(ctx, primary.DSN("lockdb")); err != nil {
		return rep, err
	}
	standby, err := primary.StartStandby(ctx, pgcluster.StandbyConfig{Name: "standby1"})
	if err != nil {
		return rep, fmt.Errorf("failover: start lockdb standby: %w", err)
	}
	defer standby.Close()
	if cfg.Mode == ModeSync {
		if err := primary.SetSynchronousStandby(ctx, "standby1"); err != nil {
			return rep, err
		}
	}

	scfg := pgstore.DefaultConfig()
	scfg.DSN = pgcluster.MultiHostDSN("lockdb", primary, standby)
	scfg.AcceptPromotion = true
	scfg.ConnectTimeout = time.Second
	store, err := pgstore.Open(ctx, scfg, serverLog)
	if err != nil {
		return rep, err
	}
	defer store.Close()
	srvCfg := lockserver.DefaultServerConfig()
	srvCfg.RequestTimeout = time.Second
	handler, err := lockserver.NewServer(store, srvCfg, serverLog)
	if err != nil {
		return rep, err
	}
	// After the HTTP server's close (deferred below, so run first) and
	// before the store's: the releases of abandoned grants use the store.
	defer handler.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return rep, err
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close(); <-served }()
	url := "http://" + ln.Addr().String()

	if rep.PaydbBefore, err = readPaydb(ctx, paydb); err != nil {
		return rep, err
	}
	logger.Info("lockdb failover experiment started", "event", EventStarted, "mode", cfg.Mode, "seed", cfg.Seed,
		"clients", cfg.Clients, "keys", cfg.Keys, "primaryPort", primary.Port(), "standbyPort", standby.Port(), "paydbPort", paydb.Port())

	start := time.Now()
	since := func() time.Duration { return time.Since(start) }
	var (
		mu       sync.Mutex
		attempts []attempt
		grants   []Grant
		wg       sync.WaitGroup
	)
	f := &fence{hw: map[string]int64{}}
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	for i := range cfg.Clients {
		owner := fmt.Sprintf("failover-client-%d", i)
		rng := rand.New(rand.NewPCG(cfg.Seed, uint64(i)))
		c, err := client.New(url, client.WithOwner(owner), client.WithRand(rand.New(rand.NewPCG(cfg.Seed, uint64(i)+1000))),
			client.WithRequestTimeout(2*time.Second))
		if err != nil {
			return rep, err
		}
		wg.Go(func() {
			for loadCtx.Err() == nil {
				key := fmt.Sprintf("payout:acct-%d", rng.IntN(cfg.Keys))
				a := attempt{Sent: since()}
				l, err := c.TryAcquire(loadCtx, key, client.WithTTL(cfg.TTL))
				a.Answered = since()
				switch {
				case loadCtx.Err() != nil:
					if l != nil {
						_ = l.Release(context.Background())
					}
					return // the run is over: this answer is not counted
				case err == nil:
					a.Outcome = outGranted
				case errors.Is(err, client.ErrLockHeld):
					a.Outcome = outHeld
				case errors.Is(err, client.ErrBackendRestored):
					a.Outcome = outRestored
				case errors.Is(err, client.ErrUnavailable):
					a.Outcome = outUnavail
				default:
					a.Outcome = outOther
				}
				mu.Lock()
				attempts = append(attempts, a)
				mu.Unlock()
				if l != nil {
					g := Grant{Key: key, Owner: owner, Token: l.Token(), SentMs: a.Sent.Milliseconds(), GrantMs: a.Answered.Milliseconds()}
					if l.Check() == nil {
						g.Accepted = f.write(key, l.Token())
					}
					if rng.IntN(2) == 0 {
						_ = l.Renew(loadCtx)
					}
					time.Sleep(time.Duration(rng.IntN(5)) * time.Millisecond) // the critical section
					g.ReleaseMs = since().Milliseconds()
					if l.Check() != nil {
						g.ReleaseMs = min(g.ReleaseMs, time.Until(l.Deadline()).Milliseconds()+since().Milliseconds())
					}
					_ = l.Release(loadCtx)
					mu.Lock()
					grants = append(grants, g)
					mu.Unlock()
				}
				time.Sleep(time.Duration(rng.IntN(10)) * time.Millisecond)
			}
		})
	}

	if cfg.StandbyStall > 0 {
		sleep(ctx, cfg.Before-min(cfg.StandbyStall, cfg.Before))
		paused, err := primary.PauseWALSenders()
		if err != nil || paused == 0 {
			stopLoad()
			wg.Wait()
			return rep, fmt.Errorf("failover: pause the WAL senders: %d paused, %v", paused, err)
		}
		logger.Warn("lockdb primary's WAL senders stopped: the standby stops receiving WAL", "event", EventStandbyStalled, "atMs", since().Milliseconds(),
			"stallMs", cfg.StandbyStall.Milliseconds())
		sleep(ctx, min(cfg.StandbyStall, cfg.Before))
	} else {
		sleep(ctx, cfg.Before)
	}
	var (
		killMu  sync.Mutex
		killAt  time.Duration = -1
		readyWG sync.WaitGroup
	)
	rep.ReadyzDownMs, rep.ReadyzUpMs = -1, -1
	readyWG.Go(func() {
		probe := &http.Client{Timeout: 2 * time.Second}
		for loadCtx.Err() == nil {
			req, _ := http.NewRequestWithContext(loadCtx, http.MethodGet, url+api.PathReady, nil)
			resp, err := probe.Do(req)
			ready := err == nil && resp.StatusCode == http.StatusOK
			if resp != nil {
				resp.Body.Close()
			}
			at := since()
			killMu.Lock()
			k := killAt
			killMu.Unlock()
			if k >= 0 && loadCtx.Err() == nil {
				switch {
				case !ready && rep.ReadyzDownMs < 0:
					rep.ReadyzDownMs = (at - k).Milliseconds()
				case ready && rep.ReadyzDownMs >= 0 && rep.ReadyzUpMs < 0:
					rep.ReadyzUpMs = (at - k).Milliseconds()
				}
			}
			sleep(loadCtx, 50*time.Millisecond)
		}
	})
	defer func() { stopLoad(); readyWG.Wait() }()
	if err := primary.Kill(); err != nil {
		stopLoad()
		wg.Wait()
		return rep, err
	}
	kill := since()
	killMu.Lock()
	killAt = kill
	killMu.Unlock()
	logger.Warn("lockdb primary killed (SIGKILL, every process)", "event", EventPrimaryKilled, "atMs", kill.Milliseconds(), "port", primary.Port())
	sleep(ctx, cfg.PromoteDelay)
	// What the promoted lockdb would issue next: read before any grant
	// there (lock-server's pool cannot reach it while it is in recovery).
	if err := standby.Promote(ctx); err != nil {
		stopLoad()
		wg.Wait()
		return rep, err
	}
	promoted := since()
	if rep.SequenceAfterPromotion, err = readSequence(ctx, standby); err != nil {
		logger.Warn("could not read the promoted sequence", "error", err.Error())
	}
	logger.Warn("lockdb standby promoted", "event", EventStandbyPromoted, "atMs", promoted.Milliseconds(), "port", standby.Port(),
		"sequenceLastValue", rep.SequenceAfterPromotion)
	sleep(ctx, cfg.After)
	stopLoad()
	wg.Wait()
	readyWG.Wait()
	end := since()

	if rep.PaydbAfter, err = readPaydb(ctx, paydb); err != nil {
		return rep, err
	}
	rep.KillMs, rep.PromotedMs, rep.EndMs = kill.Milliseconds(), promoted.Milliseconds(), end.Milliseconds()
	sort.Slice(grants, func(i, j int) bool { return grants[i].GrantMs < grants[j].GrantMs })
	rep.Grantlist = grants
	measure(&rep, attempts, kill, end, cfg.Window)
	Check(&rep)
	logger.Info("acquire availability around the lockdb failover", "event", EventDip, "mode", cfg.Mode, "seed", cfg.Seed,
		"attempts", rep.Attempts, "grants", rep.Grants,
		"firstFailureMs", rep.Dip.FirstFailureMs, "lastFailureMs", rep.Dip.LastFailureMs, "recoveredMs", rep.Dip.RecoveredMs,
		"dipAttempts", rep.Dip.Attempts, "dipFailed", rep.Dip.Failed, "dipFailedPct", rep.Dip.FailedPct,
		"unavailable", rep.Dip.Unavailable, "restored", rep.Dip.Restored, "slowestMs", rep.Dip.SlowestMs, "readyzDownMs", rep.ReadyzDownMs, "readyzUpMs", rep.ReadyzUpMs, "standbyStallMs", rep.StandbyStallMs, "promotedAfterKillMs", rep.PromotedMs-rep.KillMs)
	level := slog.LevelInfo
	if len(rep.Violations) > 0 {
		level = slog.LevelError
	}
	logger.Log(ctx, level, "safety checks of the lockdb failover", "event", EventSafety, "mode", cfg.Mode, "seed", cfg.Seed,
		"violations", len(rep.Violations), "highestTokenBeforeKill", rep.HighestBeforeKill, "lowestTokenAfterPromotion", rep.LowestAfterPromotion,
		"sequenceAfterPromotion", rep.SequenceAfterPromotion, "repeatableTokens", rep.RepeatableTokens,
		"paydbUntouched", rep.PaydbBefore == rep.PaydbAfter)
	for _, v := range rep.Violations {
		logger.Error("safety violation", "event", EventSafety, "violation", v)
	}
	if len(rep.Violations) > 0 {
		return rep, fmt.Errorf("%w: %d: %s", ErrUnsafe, len(rep.Violations), rep.Violations[0])
	}
	return rep, nil
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// measure fills the windows (by answer time) and the dip from the
// attempts.
func measure(rep *Report, attempts []attempt, kill, end, width time.Duration) {
	rep.Attempts = len(attempts)
	n := int(end/width) + 1
	rep.Windows = make([]Window, n)
	for i := range rep.Windows {
		rep.Windows[i].StartMs = (time.Duration(i) * width).Milliseconds()
	}
	rep.Dip = Dip{FirstFailureMs: -1, LastFailureMs: -1, RecoveredMs: -1}
	lastFailure := kill
	for _, a := range attempts {
		if a.Outcome == outGranted {
			rep.Grants++
		}
		w := min(int(a.Answered/width), n-1)
		rep.Windows[w].Attempts++
		if failed(a.Outcome) {
			rep.Windows[w].Failed++
		}
		if a.Answered < kill {
			continue
		}
		rep.Dip.SlowestMs = max(rep.Dip.SlowestMs, (a.Answered - a.Sent).Milliseconds())
		if failed(a.Outcome) {
			at := (a.Answered - kill).Milliseconds()
			if rep.Dip.FirstFailureMs < 0 || at < rep.Dip.FirstFailureMs {
				rep.Dip.FirstFailureMs = at
			}
			rep.Dip.LastFailureMs = max(rep.Dip.LastFailureMs, at)
			lastFailure = max(lastFailure, a.Answered)
		}
	}
	recovered := end
	for _, a := range attempts {
		if a.Outcome == outGranted && a.Answered > lastFailure && a.Answered < recovered {
			recovered = a.Answered
		}
	}
	if recovered < end {
		rep.Dip.RecoveredMs = (recovered - kill).Milliseconds()
	}
	for _, a := range attempts {
		if a.Answered < kill || a.Answered > recovered {
			continue
		}
		rep.Dip.Attempts++
		if failed(a.Outcome) {
			rep.Dip.Failed++
			switch a.Outcome {
			case outRestored:
				rep.Dip.Restored++
			case outUnavail:
				rep.Dip.Unavailable++
			}
		}
	}
	if rep.Dip.Attempts > 0 {
		rep.Dip.FailedPct = float64(rep.Dip.Failed) * 100 / float64(rep.Dip.Attempts)
	}
}

func failed(outcome string) bool { return outcome != outGranted && outcome != outHeld }

// Check judges rep's grants and paydb readings and appends every
// violation to rep.Violations: a token granted twice; a token granted
// after the promotion not above every token granted before the kill
// (INV-02); two holders of one key holding at once where the later grant's
// token is not above the earlier's (a fence would take the second for a
// newer holder, or refuse the rightful one); paydb changed. It also
// counts RepeatableTokens against SequenceAfterPromotion (a measurement,
// not a violation: lock-server's guard stands between the sequence and a
// holder).
func Check(rep *Report) {
	seen := map[int64]Grant{}
	rep.HighestBeforeKill, rep.LowestAfterPromotion, rep.RepeatableTokens = 0, 0, 0
	for _, g := range rep.Grantlist {
		if prev, dup := seen[g.Token]; dup {
			rep.Violations = append(rep.Violations, fmt.Sprintf("token %d granted twice: to %s on %s at %d ms and to %s on %s at %d ms",
				g.Token, prev.Owner, prev.Key, prev.GrantMs, g.Owner, g.Key, g.GrantMs))
		}
		seen[g.Token] = g
		if g.GrantMs < rep.KillMs {
			rep.HighestBeforeKill = max(rep.HighestBeforeKill, g.Token)
			if rep.SequenceAfterPromotion > 0 && g.Token > rep.SequenceAfterPromotion {
				rep.RepeatableTokens++
			}
		}
		if g.SentMs >= rep.PromotedMs && (rep.LowestAfterPromotion == 0 || g.Token < rep.LowestAfterPromotion) {
			rep.LowestAfterPromotion = g.Token
		}
	}
	if rep.LowestAfterPromotion != 0 && rep.LowestAfterPromotion <= rep.HighestBeforeKill {
		rep.Violations = append(rep.Violations, fmt.Sprintf("INV-02: token %d granted after the promotion is not above token %d granted before the kill",
			rep.LowestAfterPromotion, rep.HighestBeforeKill))
	}
	byKey := map[string][]Grant{}
	for _, g := range rep.Grantlist {
		byKey[g.Key] = append(byKey[g.Key], g)
	}
	for key, gs := range byKey {
		for i := range gs {
			for j := i + 1; j < len(gs); j++ {
				a, b := gs[i], gs[j] // a answered no later than b
				if b.GrantMs < a.ReleaseMs && a.Owner != b.Owner && b.Token <= a.Token {
					rep.Violations = append(rep.Violations, fmt.Sprintf("key %s: %s (token %d) held from %d to %d ms while %s was granted token %d at %d ms",
						key, a.Owner, a.Token, a.GrantMs, a.ReleaseMs, b.Owner, b.Token, b.GrantMs))
				}
			}
		}
	}
	if rep.PaydbBefore != rep.PaydbAfter {
		rep.Violations = append(rep.Violations, fmt.Sprintf("paydb changed: before %+v, after %+v", rep.PaydbBefore, rep.PaydbAfter))
	}
}

func seedPaydb(ctx context.Context, paydb *pgcluster.Cluster, rows int) error {
	if err := paydb.CreateDatabase(ctx, "paydb"); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, paydb.DSN("paydb"))
	if err != nil {
		return fmt.Errorf("failover: connect paydb: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// VACUUM ANALYZE leaves autovacuum nothing to do during the run, and
	// the checkpoint flushes it all: an untouched paydb writes no WAL.
	for _, q := range []string{`CREATE TABLE account (account_id text PRIMARY KEY, balance_minor bigint NOT NULL)`,
		fmt.Sprintf(`INSERT INTO account SELECT 'acct-' || i, 1000000 FROM generate_series(1, %d) i`, rows),
		`VACUUM ANALYZE`, `CHECKPOINT`} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("failover: seed paydb: %w", err)
		}
	}
	return nil
}

func readPaydb(ctx context.Context, paydb *pgcluster.Cluster) (Paydb, error) {
	conn, err := pgx.Connect(ctx, paydb.DSN("paydb"))
	if err != nil {
		return Paydb{}, fmt.Errorf("failover: connect paydb: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var p Paydb
	err = conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM account),
    (SELECT md5(coalesce(string_agg(account_id || ':' || balance_minor, ',' ORDER BY account_id), '')) FROM account),
    pg_snapshot_xmax(pg_current_snapshot())::text::bigint, pg_postmaster_start_time()`).Scan(&p.Rows, &p.Digest, &p.NextXID, &p.StartedAt)
	if err != nil {
		return Paydb{}, fmt.Errorf("failover: read paydb: %w", err)
	}
	p.StartedAt = p.StartedAt.UTC()
	return p, nil
}

func readSequence(ctx context.Context, c *pgcluster.Cluster) (int64, error) {
	conn, err := pgx.Connect(ctx, c.DSN("lockdb"))
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var v int64
	err = conn.QueryRow(ctx, `SELECT last_value FROM fencing_token_seq`).Scan(&v)
	return v, err
}
