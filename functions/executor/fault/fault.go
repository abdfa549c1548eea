// Package fault holds the faults a harness injects into the executor
// (executor.Fault): SelfStop, the fencing experiment's worker that stops
// itself with SIGSTOP before the rail submission; Pause, the game day's
// stand-in for it on Cloud Run; and Points, for tests. FromEnv builds the
// one a process's environment arms, and nil when none is: production sets
// none of its variables (docs/configuration.md).
package fault

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/client"
)

// Environment variables that arm a fault, read by FromEnv.
const (
	// EnvSelfStopBeforeSubmit arms SelfStop: the worker SIGSTOPs itself
	// before the rail submission of that payout id (the local stack's
	// experiment only).
	EnvSelfStopBeforeSubmit = "EXECUTOR_SELF_STOP_BEFORE_SUBMIT"
	// EnvPauseMs arms Pause (Pause.Duration), in milliseconds; unset or 0
	// is off. Set only by Terraform's game_day variable.
	EnvPauseMs = "EXECUTOR_FAULT_PAUSE_BEFORE_SUBMIT_MS"
	// EnvPausePayoutPrefix selects the payouts Pause applies to
	// (Pause.PayoutPrefix).
	EnvPausePayoutPrefix = "EXECUTOR_FAULT_PAUSE_PAYOUT_PREFIX"
)

// EnvNames returns the variables FromEnv reads, for envcheck.
func EnvNames() []string {
	return []string{EnvSelfStopBeforeSubmit, EnvPauseMs, EnvPausePayoutPrefix}
}

// Log events of the faults (docs/log-events.md, section executor).
const (
	// EventSelfStopArmed: SelfStop will stop this worker before the rail
	// submission.
	EventSelfStopArmed = "self_stop_armed"
	// EventSelfStop: the worker stops itself with SIGSTOP.
	EventSelfStop = "self_stop"
	// EventSelfResumed: the worker runs again after SIGCONT.
	EventSelfResumed = "self_resumed"
	// EventPauseStarted and EventPauseEnded: WARN, Pause's wait before
	// the rail submission.
	EventPauseStarted = "fault_pause_started"
	EventPauseEnded   = "fault_pause_ended"
)

// ErrInvalid is wrapped by every error of FromEnv and Pause.Validate.
var ErrInvalid = errors.New("fault: invalid setting")

// FromEnv returns the fault the variables of EnvNames arm, read through
// getenv, or nil when none is; leaseTTL is the executor's
// (Config.LeaseTTL), which a pause must exceed. Arming both faults is an
// error.
func FromEnv(getenv func(string) string, leaseTTL time.Duration, log *slog.Logger) (executor.Fault, error) {
	p := &Pause{PayoutPrefix: strings.TrimSpace(getenv(EnvPausePayoutPrefix)), LeaseTTL: leaseTTL, Log: log}
	if v := strings.TrimSpace(getenv(EnvPauseMs)); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%w: %s=%q: want a number of milliseconds, 0 for off", ErrInvalid, EnvPauseMs, v)
		}
		p.Duration = time.Duration(n) * time.Millisecond
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	target := strings.TrimSpace(getenv(EnvSelfStopBeforeSubmit))
	switch {
	case target != "" && p.Duration > 0:
		return nil, fmt.Errorf("%w: %s and %s are both set; arm one fault at a time", ErrInvalid, EnvSelfStopBeforeSubmit, EnvPauseMs)
	case target != "":
		return NewSelfStop(target, log), nil
	case p.Duration > 0:
		return p, nil
	}
	return nil, nil
}

// MaxPause caps Pause.Duration: the executor's Cloud Run request timeout
// is 180 s on game days (terraform/main.tf), and a pause longer than the
// request lives would never reach a fence.
const MaxPause = 10 * time.Minute

// Pause makes the first delivery of a selected payout behave as a worker
// stopped at BeforeSubmit for Duration: its lease is not renewed in the
// background, so lock-server ends it during the pause, and when it wakes
// it carries on as if it still held the lease, on a context that no
// longer ends with its push request, so that its stale token reaches the
// fences. Only delivery attempt 1 pauses (a push without Pub/Sub's
// deliveryAttempt never does); every other delivery runs normally.
type Pause struct {
	// Duration is how long the selected delivery pauses: more than
	// LeaseTTL, at most MaxPause (EnvPauseMs). 0 is off.
	Duration time.Duration
	// PayoutPrefix selects the payouts that pause: those whose id starts
	// with it (EnvPausePayoutPrefix). Required when Duration is set, and
	// only then.
	PayoutPrefix string
	// LeaseTTL is the executor's lease TTL (executor.Config.LeaseTTL).
	LeaseTTL time.Duration
	// Log receives the pause's WARN lines. Required.
	Log *slog.Logger
	// Sleep waits d whatever happens meanwhile, as a stopped process
	// does. nil means time.Sleep; a test passes its own to decide when
	// the paused delivery wakes.
	Sleep func(d time.Duration)
}

// Validate returns nil or every invalid field, joined, each wrapping
// ErrInvalid and naming its variable.
func (p *Pause) Validate() error {
	var errs []error
	switch {
	case p.Duration < 0:
		errs = append(errs, fmt.Errorf("%w: %s must not be negative", ErrInvalid, EnvPauseMs))
	case p.Duration == 0 && p.PayoutPrefix != "":
		errs = append(errs, fmt.Errorf("%w: %s is set but %s is not: the pause fault is half armed", ErrInvalid, EnvPausePayoutPrefix, EnvPauseMs))
	case p.Duration > 0:
		if p.PayoutPrefix == "" {
			errs = append(errs, fmt.Errorf("%w: %s is set but %s is not: every payout would pause", ErrInvalid, EnvPauseMs, EnvPausePayoutPrefix))
		}
		if p.Duration <= p.LeaseTTL {
			errs = append(errs, fmt.Errorf("%w: %s (%v) must exceed %s (%v), or the lease outlives the pause", ErrInvalid, EnvPauseMs, p.Duration, executor.EnvLeaseTTLMs, p.LeaseTTL))
		}
		if p.Duration > MaxPause {
			errs = append(errs, fmt.Errorf("%w: %s (%v) is above %v", ErrInvalid, EnvPauseMs, p.Duration, MaxPause))
		}
		if p.Log == nil {
			errs = append(errs, fmt.Errorf("%w: the pause fault needs a logger", ErrInvalid))
		}
	}
	return errors.Join(errs...)
}

// Applies reports whether delivery d pauses.
func (p *Pause) Applies(d executor.Delivery) bool {
	return p.Duration > 0 && d.Attempt == "1" && strings.HasPrefix(d.Event.PayoutID, p.PayoutPrefix)
}

// Renews reports false for the delivery that pauses: a stopped process
// renews nothing.
func (p *Pause) Renews(d executor.Delivery) bool { return !p.Applies(d) }

// At pauses the selected delivery at executor.BeforeSubmit, ignoring ctx
// as a stopped process would, and returns ctx without its cancellation;
// each call after it is still bounded by its own timeout.
func (p *Pause) At(ctx context.Context, pt executor.Point, d executor.Delivery, lease *client.Lease) context.Context {
	if pt != executor.BeforeSubmit || !p.Applies(d) {
		return ctx
	}
	log := p.Log.With("payoutId", d.Event.PayoutID, "accountId", d.Event.AccountID, "deliveryAttempt", d.Attempt,
		"ownerId", lease.Owner(), "token", lease.Token())
	log.WarnContext(ctx, "fault injection: pausing after the last lease confirmation, before the rail submission", "event", EventPauseStarted,
		"pauseMs", p.Duration.Milliseconds(), "ttlMs", p.LeaseTTL.Milliseconds())
	if p.Sleep != nil {
		p.Sleep(p.Duration)
	} else {
		time.Sleep(p.Duration)
	}
	log.WarnContext(ctx, "fault injection: pause over; carrying on as if the lease were still held", "event", EventPauseEnded,
		"pauseMs", p.Duration.Milliseconds(), "requestEnded", ctx.Err() != nil)
	return context.WithoutCancel(ctx)
}

// SelfStop stops this process with SIGSTOP, once, at
// executor.BeforeSubmit of payout PayoutID, so that the fencing
// experiment can let its lease expire and resume it with SIGCONT. Make
// it with NewSelfStop.
type SelfStop struct {
	payoutID string
	log      *slog.Logger
	once     sync.Once
}

// NewSelfStop returns a SelfStop for payoutID, and logs that it is armed.
func NewSelfStop(payoutID string, log *slog.Logger) *SelfStop {
	log.Warn("experiment hook armed: this worker will SIGSTOP itself before the rail submission", "event", EventSelfStopArmed, "payoutId", payoutID)
	return &SelfStop{payoutID: payoutID, log: log}
}

// Renews reports true: the process renews its lease until it is stopped.
func (s *SelfStop) Renews(executor.Delivery) bool { return true }

// At stops the process at executor.BeforeSubmit of the payout, once.
func (s *SelfStop) At(ctx context.Context, pt executor.Point, d executor.Delivery, lease *client.Lease) context.Context {
	if pt != executor.BeforeSubmit || d.Event.PayoutID != s.payoutID {
		return ctx
	}
	s.once.Do(func() {
		e, token := d.Event, lease.Token()
		s.log.Warn("stopping self before the rail submission", "event", EventSelfStop, "payoutId", e.PayoutID, "accountId", e.AccountID, "token", token, "pid", os.Getpid())
		// SIGSTOP sent to the process may be taken by another thread while
		// this one runs on for a moment, long enough to reach the rail.
		// Sent to this very thread, it stops the process before Tgkill
		// returns.
		runtime.LockOSThread()
		_ = syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
		runtime.UnlockOSThread()
		s.log.Warn("resumed after SIGCONT; carrying on as if the lease were still held", "event", EventSelfResumed, "payoutId", e.PayoutID, "token", token)
	})
	return ctx
}

// Points is a Fault for tests: at each point it has a function for, it
// calls that function; every lease is renewed.
type Points map[executor.Point]func(ctx context.Context, d executor.Delivery, lease *client.Lease)

// Renews reports true.
func (Points) Renews(executor.Delivery) bool { return true }

// At calls the function of point pt, if any, and returns ctx.
func (f Points) At(ctx context.Context, pt executor.Point, d executor.Delivery, lease *client.Lease) context.Context {
	if g := f[pt]; g != nil {
		g(ctx, d, lease)
	}
	return ctx
}

var (
	_ executor.Fault = (*Pause)(nil)
	_ executor.Fault = (*SelfStop)(nil)
	_ executor.Fault = Points(nil)
)
