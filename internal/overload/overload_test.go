package overload_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/overload"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/overload/overloadtest"
)

// A Guard starts no goroutine.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var errDown = errors.New("backend: unavailable")

type fakeNow struct {
	mu sync.Mutex
	t  time.Time
}

func (f *fakeNow) now() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.t }
func (f *fakeNow) add(d time.Duration) {
	f.mu.Lock()
	f.t = f.t.Add(d)
	f.mu.Unlock()
}

func newGuard(t *testing.T, cfg overload.Config) (*overload.Guard, *prometheus.Registry) {
	t.Helper()
	g, err := overload.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := g.Register(reg, overload.Metrics{Stalled: "test_backend_stalled", StalledHelp: "h", InFlight: "test_in_flight", InFlightHelp: "h"}); err != nil {
		t.Fatal(err)
	}
	return g, reg
}

func TestDefaultConfigIsValidAndValidateReportsEveryField(t *testing.T) {
	if err := overload.DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	err := overload.Config{MaxInFlight: 0, StallProbeInterval: -1}.Validate()
	if !errors.Is(err, overload.ErrInvalidConfig) {
		t.Fatalf("got %v; want ErrInvalidConfig", err)
	}
	if n := len(err.(interface{ Unwrap() []error }).Unwrap()); n != 2 {
		t.Fatalf("%d errors; want one per field (2): %v", n, err)
	}
	for _, c := range []overload.Config{
		{MaxInFlight: overload.MaxMaxInFlight + 1, StallProbeInterval: time.Second},
		{MaxInFlight: 1, StallProbeInterval: overload.MaxStallProbeInterval + 1},
	} {
		if err := c.Validate(); !errors.Is(err, overload.ErrInvalidConfig) {
			t.Errorf("%+v: got %v; want ErrInvalidConfig", c, err)
		}
	}
	if _, err := overload.New(overload.DefaultConfig(), nil); !errors.Is(err, overload.ErrInvalidConfig) {
		t.Errorf("nil logger: got %v", err)
	}
}

func TestRequestsBeyondMaxInFlightAreRefusedAndSlotsComeBack(t *testing.T) {
	cfg := overload.DefaultConfig()
	cfg.MaxInFlight = 2
	g, reg := newGuard(t, cfg)
	r1, _, ok1 := g.Admit()
	r2, _, ok2 := g.Admit()
	if !ok1 || !ok2 {
		t.Fatal("the first two requests were refused")
	}
	if got := overloadtest.Gauge(t, reg, "test_in_flight"); got != 2 {
		t.Fatalf("in-flight gauge %v; want 2", got)
	}
	if _, reason, ok := g.Admit(); ok || reason != overload.ReasonOverloaded {
		t.Fatalf("the third request: ok=%v reason=%q; want refused, overloaded", ok, reason)
	}
	r1()
	r1() // a second release is a no-op: it must not free a slot it does not hold
	r3, _, ok := g.Admit()
	if !ok {
		t.Fatal("a freed slot was not given again")
	}
	if _, _, ok := g.Admit(); ok {
		t.Fatal("a double release freed two slots")
	}
	r2()
	r3()
	if g.InFlight() != 0 || overloadtest.Gauge(t, reg, "test_in_flight") != 0 {
		t.Fatalf("in flight %d (gauge %v) after every release; want 0", g.InFlight(), overloadtest.Gauge(t, reg, "test_in_flight"))
	}
}

func TestAStalledBackendIsProbedOncePerIntervalAndRecovers(t *testing.T) {
	clock := &fakeNow{t: time.Unix(1_790_000_000, 0)}
	cfg := overload.DefaultConfig()
	cfg.StallProbeInterval, cfg.Now = time.Minute, clock.now
	g, reg := newGuard(t, cfg)
	g.Observe(overload.TimedOut, errDown)
	if !g.Stalled() || overloadtest.Gauge(t, reg, "test_backend_stalled") != 1 {
		t.Fatal("a full-deadline timeout did not mark the backend stalled")
	}
	for i := range 3 {
		if _, reason, ok := g.Admit(); ok || reason != overload.ReasonStalled {
			t.Fatalf("request %d while stalled: ok=%v reason=%q; want refused, stalled", i, ok, reason)
		}
	}
	if g.InFlight() != 0 {
		t.Fatalf("refused requests hold %d slots", g.InFlight())
	}
	clock.add(time.Minute)
	probe, _, ok := g.Admit()
	if !ok {
		t.Fatal("no probe after the interval")
	}
	if _, reason, ok := g.Admit(); ok || reason != overload.ReasonStalled {
		t.Fatal("a second request was let through while the probe runs")
	}
	g.Observe(overload.TimedOut, errDown) // the probe times out too
	probe()
	if _, _, ok := g.Admit(); ok {
		t.Fatal("a failed probe did not put the next one an interval away")
	}
	clock.add(time.Minute)
	probe, _, ok = g.Admit()
	if !ok {
		t.Fatal("no second probe")
	}
	g.Observe(overload.Answered, nil)
	probe()
	if g.Stalled() || overloadtest.Gauge(t, reg, "test_backend_stalled") != 0 {
		t.Fatal("an answer did not clear the mark")
	}
	rel, _, ok := g.Admit()
	if !ok {
		t.Fatal("refused after recovery")
	}
	rel()
}

func TestInconclusiveOutcomesChangeNothing(t *testing.T) {
	g, _ := newGuard(t, overload.DefaultConfig())
	g.Observe(overload.Inconclusive, context.Canceled)
	if g.Stalled() {
		t.Fatal("an inconclusive call marked the backend stalled")
	}
	g.Observe(overload.TimedOut, errDown)
	g.Observe(overload.Inconclusive, context.Canceled)
	if !g.Stalled() {
		t.Fatal("an inconclusive call cleared the mark")
	}
}

func TestClassify(t *testing.T) {
	expired := func(full bool) context.Context {
		ctx := context.Background()
		if full {
			ctx = overload.MarkFull(ctx)
		}
		ctx, cancel := context.WithTimeout(ctx, time.Nanosecond)
		t.Cleanup(cancel)
		<-ctx.Done()
		return ctx
	}
	cancelled, cancel := context.WithCancel(overload.MarkFull(context.Background()))
	cancel()
	live := overload.MarkFull(context.Background())
	for _, c := range []struct {
		name string
		ctx  context.Context
		err  error
		want overload.Outcome
	}{
		{"success", live, nil, overload.Answered},
		{"a refusal of the backend's own", live, errors.New("row not found"), overload.Answered},
		{"unavailable, full deadline passed", expired(true), fmt.Errorf("%w: %w", errDown, context.DeadlineExceeded), overload.TimedOut},
		{"bare deadline, full deadline passed", expired(true), context.DeadlineExceeded, overload.TimedOut},
		{"unavailable, the caller's shorter budget passed", expired(false), errDown, overload.Inconclusive},
		{"unavailable before any deadline (a lost connection)", live, errDown, overload.Inconclusive},
		{"the caller went away", cancelled, context.Canceled, overload.Inconclusive},
	} {
		if got := overload.Classify(c.ctx, c.err, errDown); got != c.want {
			t.Errorf("%s: %v; want %v", c.name, got, c.want)
		}
	}
}

func TestWithTimeoutMarksOnlyTheFullDeadline(t *testing.T) {
	ctx, cancel := overload.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	if overload.Classify(ctx, context.DeadlineExceeded, errDown) != overload.TimedOut {
		t.Fatal("WithTimeout on a parent without deadline: not marked full")
	}
	parent, pcancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer pcancel()
	ctx, cancel = overload.WithTimeout(parent, time.Hour)
	defer cancel()
	<-ctx.Done()
	if overload.Classify(ctx, context.DeadlineExceeded, errDown) != overload.Inconclusive {
		t.Fatal("WithTimeout under a parent that ends sooner: marked full")
	}
}

func TestSetRetryAfter(t *testing.T) {
	rec := httptest.NewRecorder()
	overload.SetRetryAfter(rec.Header())
	if got := rec.Header().Get("Retry-After"); got != "1" {
		t.Fatalf("Retry-After %q; want 1", got)
	}
}

func TestRegisterRefusesMissingNamesAndDuplicates(t *testing.T) {
	g, err := overload.New(overload.DefaultConfig(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := g.Register(reg, overload.Metrics{}); !errors.Is(err, overload.ErrInvalidConfig) {
		t.Fatalf("no names: %v", err)
	}
	if err := g.Register(reg, overload.Metrics{Stalled: "x_stalled", StalledHelp: "h"}); err != nil {
		t.Fatal(err)
	}
	if err := g.Register(reg, overload.Metrics{Stalled: "x_stalled", StalledHelp: "h"}); err == nil {
		t.Fatal("a second registration of the same name succeeded")
	}
	if mfs, err := reg.Gather(); err != nil || len(mfs) != 1 {
		t.Fatalf("%d metrics registered (%v); want 1", len(mfs), err)
	}
}

// StallAfter: a backend that answers nothing for StallAfter while calls
// run is marked stalled, and every running call is cut with ErrStalled,
// long before their own deadline.
func TestCallsThatNothingAnswersAreCutAfterStallAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := overload.DefaultConfig()
		cfg.StallAfter = time.Second
		cfg.Ping = func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() } // frozen: no answer
		g, reg := newGuard(t, cfg)
		ctxA, doneA := g.Call(context.Background(), time.Minute, errDown)
		time.Sleep(500 * time.Millisecond)
		ctxB, doneB := g.Call(context.Background(), time.Minute, errDown)
		time.Sleep(500 * time.Millisecond) // A has run StallAfter, nothing answered
		synctest.Wait()
		if g.Stalled() {
			t.Fatal("marked stalled before the ping had its StallAfter to answer")
		}
		time.Sleep(time.Second) // the ping gets no answer either
		synctest.Wait()
		if !g.Stalled() || overloadtest.Gauge(t, reg, "test_backend_stalled") != 1 {
			t.Fatal("no answer for StallAfter did not mark the backend stalled")
		}
		for name, ctx := range map[string]context.Context{"A": ctxA, "B": ctxB} {
			if ctx.Err() == nil || !errors.Is(context.Cause(ctx), overload.ErrStalled) {
				t.Errorf("call %s: err %v cause %v; want cut with ErrStalled", name, ctx.Err(), context.Cause(ctx))
			}
		}
		doneA(fmt.Errorf("%w: %w", errDown, ctxA.Err()))
		doneB(fmt.Errorf("%w: %w", errDown, ctxB.Err()))
		if !g.Stalled() {
			t.Fatal("the cut calls' outcome cleared the mark")
		}
		time.Sleep(time.Second) // B's watch, started before the mark, ends its ping
		synctest.Wait()
	})
}

// A slow call is not a stall while other calls answer.
func TestASlowCallIsNotCutWhileOthersAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := overload.DefaultConfig()
		cfg.StallAfter = time.Second
		cfg.Ping = func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
		g, _ := newGuard(t, cfg)
		slow, doneSlow := g.Call(context.Background(), time.Minute, errDown)
		time.Sleep(500 * time.Millisecond)
		_, doneQuick := g.Call(context.Background(), time.Minute, errDown)
		doneQuick(nil) // the backend answers
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if g.Stalled() || slow.Err() != nil {
			t.Fatalf("stalled=%v, slow call err %v; want neither: the backend answered meanwhile", g.Stalled(), slow.Err())
		}
		doneSlow(nil)
		// Without StallAfter nothing but a full deadline marks it.
		g2, _ := newGuard(t, overload.DefaultConfig())
		ctx, done := g2.Call(context.Background(), time.Hour, errDown)
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		if g2.Stalled() || ctx.Err() != nil {
			t.Fatal("StallAfter 0 cut a call")
		}
		done(nil)
	})
}

// A call waiting alone (a lock wait, a long query) is not a stall while
// the backend answers a ping: it goes on, and is watched again.
func TestASlowCallIsNotCutWhileTheBackendAnswersAPing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var pings atomic.Int64
		cfg := overload.DefaultConfig()
		cfg.StallAfter = time.Second
		cfg.Ping = func(context.Context) error { pings.Add(1); return nil }
		g, _ := newGuard(t, cfg)
		ctx, done := g.Call(context.Background(), time.Minute, errDown)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if g.Stalled() || ctx.Err() != nil || pings.Load() < 5 {
			t.Fatalf("stalled=%v, call err %v, %d pings; want a slow call left alone and watched (about one ping a second)", g.Stalled(), ctx.Err(), pings.Load())
		}
		done(nil)
	})
}

func TestStallAfterNeedsPing(t *testing.T) {
	cfg := overload.DefaultConfig()
	cfg.StallAfter = time.Second
	if err := cfg.Validate(); !errors.Is(err, overload.ErrInvalidConfig) {
		t.Fatalf("StallAfter without Ping: %v; want ErrInvalidConfig", err)
	}
}

// A Call that runs out its full deadline marks the backend stalled, as
// Observe(TimedOut) does.
func TestACallRunningOutItsDeadlineMarksTheBackendStalled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g, _ := newGuard(t, overload.DefaultConfig())
		ctx, done := g.Call(context.Background(), time.Second, errDown)
		<-ctx.Done()
		done(fmt.Errorf("%w: %w", errDown, ctx.Err()))
		if !g.Stalled() {
			t.Fatal("a full-deadline timeout did not mark the backend stalled")
		}
	})
}

// Env.Load takes every good value, refuses every bad one naming its
// variable, and leaves a field alone when its variable is bad or unset.
func TestEnvLoad(t *testing.T) {
	e := overload.Env{MaxInFlight: "X_MAX", StallProbeMs: "X_PROBE", StallAfterMs: "X_AFTER"}
	vars := map[string]string{"X_MAX": " 12 ", "X_PROBE": "250", "X_AFTER": "0"}
	n, probe, after := 1, time.Second, time.Second
	if errs := e.Load(func(k string) string { return vars[k] }, &n, &probe, &after); len(errs) != 0 || n != 12 || probe != 250*time.Millisecond || after != 0 {
		t.Fatalf("good values: %v, %d %v %v", errs, n, probe, after)
	}
	vars = map[string]string{"X_MAX": "0", "X_PROBE": "0", "X_AFTER": "-1"}
	errs := e.Load(func(k string) string { return vars[k] }, &n, &probe, &after)
	if len(errs) != 3 || n != 12 || probe != 250*time.Millisecond || after != 0 {
		t.Fatalf("bad values: %v, %d %v %v; want 3 errors and nothing changed", errs, n, probe, after)
	}
	for i, name := range []string{"X_MAX", "X_PROBE", "X_AFTER"} {
		if !strings.Contains(errs[i].Error(), name) {
			t.Errorf("error %q does not name %s", errs[i], name)
		}
	}
	if errs := e.Load(func(string) string { return "" }, &n, &probe, &after); len(errs) != 0 || n != 12 {
		t.Fatalf("unset: %v, %d", errs, n)
	}
}
