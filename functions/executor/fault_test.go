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
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpjson"
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
			httpjson.WriteError(w, http.StatusConflict, fencewire.CodeFencedOut, "stale token", false)
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
	cfg.FaultPause = executor.FaultPause{Duration: 3 * time.Second, PayoutPrefix: "p-"}
	paused, wake := make(chan time.Duration, 2), make(chan struct{})
	x, err := executor.New(cfg, slog.New(slog.DiscardHandler), executor.WithRand(rand.New(rand.NewPCG(1, 2))),
		executor.WithPauseFunc(func(d time.Duration) { paused <- d; <-wake }))
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
		if d != cfg.FaultPause.Duration {
			t.Fatalf("paused for %v; want FaultPause.Duration %v", d, cfg.FaultPause.Duration)
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

// TestPauseFaultIsOffByDefaultAndValidated: DefaultConfig has it off, and
// one LoadConfig names every wrong pause variable at once.
func TestPauseFaultIsOffByDefaultAndValidated(t *testing.T) {
	if f := executor.DefaultConfig().FaultPause; f.Armed() || f.Applies("p-1", "1") {
		t.Fatalf("DefaultConfig().FaultPause = %+v; want off", f)
	}
	base := map[string]string{lockapi.EnvServerURL: "http://a", executor.EnvPaymentResourceURL: "http://b", executor.EnvRailProxyURL: "http://c"}
	load := func(extra map[string]string) (executor.Config, error) {
		return executor.LoadConfig(func(k string) string {
			if v, ok := extra[k]; ok {
				return v
			}
			return base[k]
		})
	}
	c, err := load(map[string]string{executor.EnvFaultPauseMs: "30000", executor.EnvFaultPausePayoutPrefix: "gd-"})
	if err != nil || c.FaultPause != (executor.FaultPause{Duration: 30 * time.Second, PayoutPrefix: "gd-"}) {
		t.Fatalf("LoadConfig = %+v, %v", c.FaultPause, err)
	}
	for _, tc := range []struct {
		f          executor.FaultPause
		attempt    string
		payout     string
		wantPaused bool
	}{
		{c.FaultPause, "1", "gd-both-on", true},
		{c.FaultPause, "2", "gd-both-on", false},
		{c.FaultPause, "", "gd-both-on", false},
		{c.FaultPause, "1", "p-1", false},
	} {
		if got := tc.f.Applies(tc.payout, tc.attempt); got != tc.wantPaused {
			t.Errorf("Applies(%q, attempt %q) = %v; want %v", tc.payout, tc.attempt, got, tc.wantPaused)
		}
	}
	for name, tc := range map[string]struct {
		env  map[string]string
		want []string
	}{
		"not a number":           {map[string]string{executor.EnvFaultPauseMs: "soon", executor.EnvLeaseTTLMs: "x"}, []string{executor.EnvFaultPauseMs, executor.EnvLeaseTTLMs}},
		"no selector, too short": {map[string]string{executor.EnvFaultPauseMs: "5000"}, []string{executor.EnvFaultPausePayoutPrefix, "must exceed " + executor.EnvLeaseTTLMs}},
		"selector only":          {map[string]string{executor.EnvFaultPausePayoutPrefix: "gd-"}, []string{"half armed"}},
		"too long":               {map[string]string{executor.EnvFaultPauseMs: "3600000", executor.EnvFaultPausePayoutPrefix: "gd-"}, []string{"above"}},
	} {
		_, err := load(tc.env)
		if !errors.Is(err, executor.ErrInvalidConfig) {
			t.Errorf("%s: LoadConfig error %v; want ErrInvalidConfig", name, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: LoadConfig error %q does not say %q", name, err, w)
			}
		}
	}
}
