package executor_test

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor/fault"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	lockapi "github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// fencedDeps puts one high-water mark in front of fakeDeps, as both fence
// points keep one: a write whose token is below the highest token seen is
// refused 409 FENCED_OUT and never reaches fakeDeps.
type fencedDeps struct {
	*fakeDeps
	mu       sync.Mutex
	hwm      int64
	railSent []int64 // tokens of the rail submissions let through
	refused  []int64 // tokens refused at the fence
}

func (f *fencedDeps) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if tok, err := strconv.ParseInt(r.Header.Get(fencewire.HeaderToken), 10, 64); err == nil && r.Method == http.MethodPost {
		f.mu.Lock()
		if tok < f.hwm {
			f.refused = append(f.refused, tok)
			f.mu.Unlock()
			jsonhandler.WriteError(w, http.StatusConflict, fencewire.CodeFencedOut, "stale token", false)
			return
		}
		f.hwm = tok
		if r.URL.Path == railapi.PathSubmissions {
			f.railSent = append(f.railSent, tok)
		}
		f.mu.Unlock()
	}
	f.fakeDeps.ServeHTTP(w, r)
}

// TestPauseFaultMakesTheFirstDeliveryAStaleHolder is the game day's stale
// worker on one executor, as on Cloud Run: delivery 1 of a selected payout
// pauses after its last lease confirmation; its lease, not renewed while
// paused, expires on lock-server's schedule; delivery 2 of the same
// message (not paused) takes a newer lease and posts the payout; delivery 1
// wakes, carries on with its old token, and the fence refuses it.
func TestPauseFaultMakesTheFirstDeliveryAStaleHolder(t *testing.T) {
	store := memstore.New(nil)
	ls, err := lockserver.NewServer(store, lockserver.DefaultServerConfig(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	lsrv := httptest.NewServer(ls)
	t.Cleanup(lsrv.Close)
	deps := &fencedDeps{fakeDeps: &fakeDeps{railStatus: 200, railBody: `{"status":"ACK","railRef":"rail-000001"}`}}
	dsrv := httptest.NewServer(deps)
	t.Cleanup(dsrv.Close)

	cfg := executor.DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL = lsrv.URL, dsrv.URL, dsrv.URL
	cfg.Owner, cfg.LeaseTTL, cfg.AcquireWait = "worker-a", time.Duration(lockapi.MinTTLMs)*time.Millisecond, 5*time.Second
	cfg.ReportRetry = executor.RetryConfig{Attempts: 2, Initial: time.Millisecond, Max: 2 * time.Millisecond}
	paused, wake := make(chan time.Duration, 2), make(chan struct{})
	pause := &fault.Pause{Duration: 3 * time.Second, PayoutPrefix: "p-", LeaseTTL: cfg.LeaseTTL, Log: slog.New(slog.DiscardHandler),
		Sleep: func(d time.Duration) { paused <- d; <-wake }}
	if err := pause.Validate(); err != nil {
		t.Fatal(err)
	}
	x, err := executor.New(cfg, slog.New(slog.DiscardHandler), executor.WithRand(rand.New(rand.NewPCG(1, 2))), executor.WithFault(pause))
	if err != nil {
		t.Fatal(err)
	}
	closeAtCleanup(t, x)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	bodyA, _ := payoutevent.Encode(event, "m-1", "acct-7", 1)
	answerA := make(chan *httptest.ResponseRecorder, 1)
	go func() { answerA <- push(t, x, bodyA) }()
	select {
	case d := <-paused:
		if d != pause.Duration {
			t.Fatalf("paused for %v; want Pause.Duration %v", d, pause.Duration)
		}
	case rec := <-answerA:
		t.Fatalf("delivery 1 answered %d %s without pausing", rec.Code, rec.Body)
	case <-ctx.Done():
		t.Fatal("delivery 1 never paused")
	}
	st, _ := store.Inspect(ctx, "payout:acct-7")
	if st.Lease == nil {
		t.Fatal("no lease held at the pause")
	}
	tokenA := st.Lease.Token
	// Nothing renews the paused delivery's lease: lock-server ends it.
	for st.Lease != nil {
		select {
		case <-ctx.Done():
			t.Fatalf("the paused delivery's lease (token %d) never expired: something renews it during the pause", tokenA)
		case <-time.After(20 * time.Millisecond):
		}
		st, _ = store.Inspect(ctx, "payout:acct-7")
	}

	bodyB, _ := payoutevent.Encode(event, "m-1", "acct-7", 2)
	answerB := make(chan *httptest.ResponseRecorder, 1)
	go func() { answerB <- push(t, x, bodyB) }()
	select {
	case rec := <-answerB:
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"posted"`) {
			t.Fatalf("delivery 2 answered %d %s; want 200 posted", rec.Code, rec.Body)
		}
	case <-paused:
		close(wake)
		t.Fatal("delivery 2 paused too: only the first delivery may pause")
	case <-ctx.Done():
		t.Fatal("delivery 2 did not answer")
	}
	close(wake)
	var recA *httptest.ResponseRecorder
	select {
	case recA = <-answerA:
	case <-ctx.Done():
		t.Fatal("delivery 1 did not answer after its pause")
	}
	if recA.Code != http.StatusConflict || !strings.Contains(recA.Body.String(), fencewire.CodeFencedOut) {
		t.Fatalf("delivery 1 answered %d %s; want 409 %s", recA.Code, recA.Body, fencewire.CodeFencedOut)
	}
	deps.mu.Lock()
	defer deps.mu.Unlock()
	if len(deps.railSent) != 1 || deps.railSent[0] <= tokenA {
		t.Errorf("rail submissions let through: tokens %v; want one, newer than the stale token %d", deps.railSent, tokenA)
	}
	if len(deps.refused) != 1 || deps.refused[0] != tokenA {
		t.Errorf("refused at the fence: tokens %v; want the stale token %d once", deps.refused, tokenA)
	}
}

// TestPauseFaultIsOffByDefaultAndValidated: an environment without the
// fault variables arms nothing, and one FromEnv names every wrong pause
// variable at once.
func TestPauseFaultIsOffByDefaultAndValidated(t *testing.T) {
	const ttl = 10 * time.Second
	log := slog.New(slog.DiscardHandler)
	load := func(env map[string]string) (executor.Fault, error) {
		return fault.FromEnv(func(k string) string { return env[k] }, ttl, log)
	}
	if f, err := load(nil); f != nil || err != nil {
		t.Fatalf("FromEnv of an empty environment = %v, %v; want nil, nil", f, err)
	}
	f, err := load(map[string]string{fault.EnvPauseMs: "30000", fault.EnvPausePayoutPrefix: "gd-"})
	p, _ := f.(*fault.Pause)
	if err != nil || p == nil || p.Duration != 30*time.Second || p.PayoutPrefix != "gd-" {
		t.Fatalf("FromEnv = %+v, %v; want a 30 s pause of gd- payouts", f, err)
	}
	for _, tc := range []struct {
		attempt    string
		payout     string
		wantPaused bool
	}{
		{"1", "gd-both-on", true},
		{"2", "gd-both-on", false},
		{"", "gd-both-on", false},
		{"1", "p-1", false},
	} {
		d := executor.Delivery{Event: payoutevent.Event{PayoutID: tc.payout}, Attempt: tc.attempt}
		if got := p.Applies(d); got != tc.wantPaused || p.Renews(d) == tc.wantPaused {
			t.Errorf("Applies(%q, attempt %q) = %v, Renews = %v; want %v and the opposite", tc.payout, tc.attempt, got, p.Renews(d), tc.wantPaused)
		}
	}
	for name, tc := range map[string]struct {
		env  map[string]string
		want []string
	}{
		"not a number":           {map[string]string{fault.EnvPauseMs: "soon"}, []string{fault.EnvPauseMs}},
		"no selector, too short": {map[string]string{fault.EnvPauseMs: "5000"}, []string{fault.EnvPausePayoutPrefix, "must exceed " + executor.EnvLeaseTTLMs}},
		"selector only":          {map[string]string{fault.EnvPausePayoutPrefix: "gd-"}, []string{"half armed"}},
		"too long":               {map[string]string{fault.EnvPauseMs: "3600000", fault.EnvPausePayoutPrefix: "gd-"}, []string{"above"}},
		"both faults":            {map[string]string{fault.EnvPauseMs: "30000", fault.EnvPausePayoutPrefix: "gd-", fault.EnvSelfStopBeforeSubmit: "p-1"}, []string{"one fault at a time"}},
	} {
		_, err := load(tc.env)
		if !errors.Is(err, fault.ErrInvalid) {
			t.Errorf("%s: FromEnv error %v; want ErrInvalid", name, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: FromEnv error %q does not say %q", name, err, w)
			}
		}
	}
}
