// Package gameday runs the local game day (SC-09): the local stack, a real
// Prometheus with the game-day alert rules and a real Alertmanager; each
// fault is injected in turn, each alert it must fire is awaited, and its
// runbook's first diagnostic is run (Run), recording detection latency and
// time to the runbook step. Run it with `make gameday` or
// ./harness/cmd/gameday; docs/gameday.md has the design and the results.
package gameday

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	payapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
	"github.com/distributed-lock-lab/distributed-lock-lab/harness/drive"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
	lockapi "github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/config"
	"github.com/distributed-lock-lab/distributed-lock-lab/ops/slo"
)

// Sentinel errors.
var (
	// ErrPrerequisite: Prometheus or Alertmanager is not installed.
	ErrPrerequisite = errors.New("gameday: missing prerequisite")
	// ErrInvalidConfig wraps every error of Config.Validate.
	ErrInvalidConfig = errors.New("gameday: invalid config")
	// ErrNotFired: an alert did not fire within Config.AlertTimeout of its
	// fault (the game day fails).
	ErrNotFired = errors.New("gameday: alert did not fire")
	// ErrNotConfirmed: an alert fired, but the first diagnostic command
	// of its runbook did not name the fault's cause (Fault.Confirms): the
	// runbook would send the person on call the wrong way (the game day
	// fails).
	ErrNotConfirmed = errors.New("gameday: runbook step did not name the cause")
)

// Config says which faults to inject and where the run lives.
type Config struct {
	// Faults are the names of the faults to inject, in order (see
	// Faults). Default: every fault.
	Faults []string
	// Repo is the repository root (the rules and runbooks are read from
	// it). Required.
	Repo string
	// Dir is the run folder: the stack's logs, Prometheus' and
	// Alertmanager's configuration, data and logs. Required.
	Dir string
	// AlertTimeout bounds the wait for each alert after its fault.
	// Default 90 s.
	AlertTimeout time.Duration
	// RunbookTimeout bounds each runbook command. Default 20 s.
	RunbookTimeout time.Duration
	// Log receives progress lines. Default: discard.
	Log *slog.Logger
}

// DefaultConfig injects every fault.
func DefaultConfig() Config {
	return Config{AlertTimeout: 90 * time.Second, RunbookTimeout: 20 * time.Second}
}

// Validate reports every invalid field, each wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	var errs []error
	if c.Repo == "" {
		errs = append(errs, fmt.Errorf("%w: Repo is required", ErrInvalidConfig))
	}
	if c.Dir == "" {
		errs = append(errs, fmt.Errorf("%w: Dir is required", ErrInvalidConfig))
	}
	if c.AlertTimeout <= 0 || c.RunbookTimeout <= 0 {
		errs = append(errs, fmt.Errorf("%w: AlertTimeout and RunbookTimeout must be positive", ErrInvalidConfig))
	}
	for _, f := range c.Faults {
		if faultByName(f) == nil {
			errs = append(errs, fmt.Errorf("%w: unknown fault %q", ErrInvalidConfig, f))
		}
	}
	return errors.Join(errs...)
}

// Result is one alert of one fault.
type Result struct {
	// Alert is the alert name; Fault the fault injected.
	Alert string `json:"alert"`
	Fault string `json:"fault"`
	// Fired is whether the webhook received the alert within AlertTimeout.
	Fired bool `json:"fired"`
	// DetectionMs is fault injected -> alert received, in milliseconds.
	DetectionMs int64 `json:"detectionMs"`
	// RunbookCommand is the runbook's first diagnostic command as run;
	// RunbookMs is alert received -> the command's answer, in ms;
	// RunbookExit its exit status; RunbookConfirms whether the answer
	// names the cause (Fault.Confirms); RunbookOutput its first lines.
	RunbookCommand  string `json:"runbookCommand"`
	RunbookMs       int64  `json:"runbookMs"`
	RunbookExit     int    `json:"runbookExit"`
	RunbookConfirms bool   `json:"runbookConfirms"`
	RunbookOutput   string `json:"runbookOutput"`
	// AlsoFired lists the other alerts received while this fault was on,
	// but those of ExpectedFired.
	AlsoFired []string `json:"alsoFired,omitempty"`
	// ExpectedFired lists the alerts received while this fault was on
	// that its phase fires by design, whatever the fault (phase.expected).
	ExpectedFired []string `json:"expectedFired,omitempty"`
}

// Report is a whole game day.
type Report struct {
	Started  time.Time `json:"started"`
	Results  []Result  `json:"results"`
	NotFired []string  `json:"notFired,omitempty"`
	// NotConfirmed are the alerts (alert/fault) that fired but whose
	// runbook's first command did not name the cause.
	NotConfirmed []string `json:"notConfirmed,omitempty"`
	// NotFiredLocally are the alerts no local fault fires, with why.
	NotFiredLocally map[string]string `json:"notFiredLocally"`
}

// env is what a fault and a runbook command see of the stack.
type env struct {
	st   *stack.Stack
	mu   sync.Mutex
	vars map[string]string // the runbook commands' environment (LS, PAY, ...)
	// bgStop and bgDone are the running background fault (startBackground).
	bgStop context.CancelFunc
	bgDone chan error
}

// startBackground runs fault in a goroutine until stopBackground (a fault
// that must keep acting while it is on, such as holding row locks).
func (e *env) startBackground(ctx context.Context, fault func(context.Context) error) error {
	bctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- fault(bctx) }() // ends with bctx (stopBackground)
	e.mu.Lock()
	e.bgStop, e.bgDone = cancel, done
	e.mu.Unlock()
	return nil
}

// stopBackground stops the goroutine of startBackground and returns its
// error (nil when it ended because it was stopped).
func (e *env) stopBackground() error {
	e.mu.Lock()
	cancel, done := e.bgStop, e.bgDone
	e.bgStop, e.bgDone = nil, nil
	e.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

func (e *env) set(k, v string) {
	e.mu.Lock()
	e.vars[k] = v
	e.mu.Unlock()
}

// Fault is one fault the game day injects on purpose.
type Fault struct {
	// Name names the fault (Config.Faults).
	Name string
	// Alerts are the alerts it must fire.
	Alerts []string
	// Inject breaks the system; Heal (may be nil) repairs it after the
	// alerts are in and the runbook steps ran.
	Inject func(ctx context.Context, e *env) error
	Heal   func(ctx context.Context, e *env) error
	// Confirms, per alert, is a pattern the runbook command's answer
	// must match to name the cause.
	Confirms map[string]string
	// Severity, when set, is the only severity of its alerts the fault
	// must fire and waits to be quiet before it: a burn alert's ticket
	// (windows of 48 and 4 minutes at 1/30 scale) may still be firing
	// from an earlier fault or a slow start on a loaded machine, while
	// its page (2 minutes and 10 s) has cleared. Default "": any.
	Severity string
	// Backend is the lock-server backend of the stack the fault needs:
	// "" or stack.BackendPostgres, or stack.BackendEtcd (three members).
	// Run groups the faults by backend, one stack each.
	Backend string
	// Executes says the fault needs payouts executed: its phase (a
	// PostgreSQL stack of its own, after the PostgreSQL phase) runs the
	// push bridge from Pub/Sub to the executor with the cloud
	// subscription's dead-letter policy, scraped by Prometheus, and a
	// reconciler that only runs when asked (POST its runs route).
	Executes bool
	// Links says the fault acts on a link between two processes
	// (stack.Config.Links): it runs in a phase of its own, last, whose
	// stack has them (with the executor path when Executes).
	Links bool
	// AlertTimeout, when longer than Config.AlertTimeout, bounds the wait
	// for this fault's alerts: an alert whose threshold is an age needs
	// that age to pass first (PayoutAmbiguousTooLong: 60 s plus its 10 s
	// "for" at 1/30 scale).
	AlertTimeout time.Duration
}

// Faults are every fault of the game day.
var Faults = []Fault{
	{
		Name:   "lock-server-killed",
		Alerts: []string{"LockServerDown"},
		Inject: func(ctx context.Context, e *env) error { return e.st.Kill("lock-server") },
		Heal:   func(ctx context.Context, e *env) error { return e.st.Restart(ctx, "lock-server") },
		// lockctl ready cannot reach it.
		Confirms: map[string]string{"LockServerDown": `no answer from lock-server`},
	},
	{
		Name:   "forged-token",
		Alerts: []string{"FenceUnverifiedTokens"},
		Inject: func(ctx context.Context, e *env) error {
			return drive.SubmitForged(ctx, e.st.PaymentResourceURL(), e.st.RailProxyURL(), "gd-acct-forged", "gd-forged-1")
		},
		Confirms: map[string]string{"FenceUnverifiedTokens": `fence_unverified_tokens_total\{resource="rail"\} [1-9]`},
	},
	{
		Name:   "rail-submitted-twice",
		Alerts: []string{"PayoutSubmittedTwice"},
		Inject: func(ctx context.Context, e *env) error {
			// Two submissions of one payout straight to the rail, past
			// both fence points (as a second, unfenced caller would).
			id := "gd-dup-1"
			e.set("ID", id)
			for range 2 {
				if err := railStubSubmit(ctx, e.st.RailStubURL(), id, "gd-acct-dup"); err != nil {
					return err
				}
			}
			return nil
		},
		Confirms: map[string]string{"PayoutSubmittedTwice": `gd-dup-1`},
	},
	// A function killed: its scrape is refused, FunctionDown pages; the
	// runbook's probe of it is refused too (curl exit 7).
	killed("payment-resource-killed", "payment-resource", "FunctionDown", false,
		func(st *stack.Stack) string { return st.PaymentResourceURL() }),
	killed("rail-proxy-killed", "rail-proxy", "FunctionDown", false,
		func(st *stack.Stack) string { return st.RailProxyURL() }),
	// A process stopped (SIGSTOP): it accepts connections and answers
	// nothing, every scrape waits out its timeout, ProcessHung pages; the
	// runbook's probe times out (curl exit 28).
	hung("lock-server-hung", "lock-server", false, func(st *stack.Stack) string { return st.LockServerURL() }),
	hung("payment-resource-hung", "payment-resource", false, func(st *stack.Stack) string { return st.PaymentResourceURL() }),
	hung("rail-proxy-hung", "rail-proxy", false, func(st *stack.Stack) string { return st.RailProxyURL() }),
	hung("rail-stub-hung", "rail-stub", false, func(st *stack.Stack) string { return st.RailStubURL() }),
	hung("executor-hung", "executor-A", false, func(st *stack.Stack) string { return st.ExecutorURL("A") }),
	killed("rail-stub-killed", "rail-stub", "FunctionDown", false,
		func(st *stack.Stack) string { return st.RailStubURL() }),
	killed("executor-killed", "executor-A", "FunctionDown", false,
		func(st *stack.Stack) string { return st.ExecutorURL("A") }),
	{
		Name:   "lockdb-killed",
		Alerts: []string{"LockStoreUnreachable", "LockAcquireErrorBudgetBurn"},
		Inject: func(ctx context.Context, e *env) error { return e.st.Kill(stack.ClusterLockdb) },
		Heal:   func(ctx context.Context, e *env) error { return e.st.Restart(ctx, stack.ClusterLockdb) },
		Confirms: map[string]string{
			"LockStoreUnreachable":       `(?i)BACKEND_UNAVAILABLE|not ready|refused|unavailable`,
			"LockAcquireErrorBudgetBurn": `(?i)BACKEND_UNAVAILABLE|unavailable|refused`,
		},
	},
	{
		// paydb and raildb (one cluster) frozen: connections accepted and
		// never answered. payment-resource's payout API and rail-proxy
		// wait out their database timeout, mark it stalled and shed.
		Name:   "paydb-frozen",
		Alerts: []string{"PayoutDatabaseStalled", "PayoutAPIErrorBudgetBurn"},
		Inject: func(ctx context.Context, e *env) error { return e.st.Freeze(stack.ClusterPaydb) },
		Heal:   func(ctx context.Context, e *env) error { return e.st.Thaw(stack.ClusterPaydb) },
		Confirms: map[string]string{
			"PayoutDatabaseStalled":    `psql exit 124`,
			"PayoutAPIErrorBudgetBurn": `class="5xx",function="payment-resource",route="` + payapi.PathPayouts + `[^"]*"\} [1-9]`,
		},
	},
	{
		// The Pub/Sub server frozen (SIGSTOP) while payouts are created:
		// payment-resource's outbox cannot publish, its rows wait.
		Name:   "pubsub-frozen",
		Alerts: []string{"PayoutOutboxStuck"},
		Inject: func(ctx context.Context, e *env) error { return e.st.Freeze("pubsub-fake") },
		Heal:   func(ctx context.Context, e *env) error { return e.st.Thaw("pubsub-fake") },
		// The unpublished rows counted (a count of 1 or more).
		Confirms: map[string]string{"PayoutOutboxStuck": `(?m)^\s*[1-9][0-9]* \|`},
	},
	{
		// Last of the PostgreSQL faults: on a loaded machine the latency
		// SLO burns by itself while the stack is young (few samples, slow
		// start-up), and its alert must be quiet before the fault.
		// lockdb answers, slowly: the load's lock row is held FOR UPDATE by
		// another session for 300 ms at a time (a long transaction, a
		// vacuum, a slow disk look the same to lock-server), so acquires
		// of it wait behind the row lock and answer in 100-300 ms.
		Name:     "lockdb-slow",
		Alerts:   []string{"LockAcquireLatencyBudgetBurn"},
		Severity: "page",
		Inject: func(ctx context.Context, e *env) error {
			return e.startBackground(ctx, func(ctx context.Context) error { return holdRowLocks(ctx, e.st.LockDBURL(), loadKey) })
		},
		Heal: func(ctx context.Context, e *env) error { return e.stopBackground() },
		// The runbook's pg_stat_activity shows acquires waiting on a row lock.
		Confirms: map[string]string{"LockAcquireLatencyBudgetBurn": `Lock +\| +(tuple|transactionid)`},
	},
	{
		// The executor-path faults (Executes: a phase of their own, with
		// the push bridge). First: the payout-completion SLO must be quiet
		// before it, and the later faults delay payouts too.
		// rail-stub answers every submission 3 s late (under rail-proxy's
		// 5 s rail timeout: the payouts are posted, late). One account's
		// payouts serialise on its lock, so the load's payouts queue
		// behind each other and all finish past the SLO's threshold (60 s,
		// 2 s at 1/30 scale).
		Name:     "rail-stub-slow",
		Executes: true,
		Alerts:   []string{"PayoutCompletionBudgetBurn"},
		// The ticket's windows (48 and 4 minutes here) outlive a phase.
		Severity: "page",
		Inject: func(ctx context.Context, e *env) error {
			return setRailStubFaults(ctx, e.st.RailStubURL(), railstub.Faults{LatencyMs: 3000})
		},
		Heal: func(ctx context.Context, e *env) error {
			return setRailStubFaults(ctx, e.st.RailStubURL(), railstub.Faults{})
		},
		// The runbook's transitions: a stretch of 3 s or more from the
		// claim to the rail's answer (acknowledged), the rail's time.
		Confirms: map[string]string{"PayoutCompletionBudgetBurn": `acknowledged\s*\|[^|\n]*\|\s*00:00:(0[3-9]|[1-5][0-9])`},
	},
	{
		// rail-proxy's high-water mark of an account set above every
		// token lock-server has granted (drive.FenceAhead), then a payout of it:
		// the executor is refused FENCED_OUT at the rail, confirms its
		// lease is current and marks the payout needs_attention.
		Name:     "fence-ahead",
		Executes: true,
		Alerts:   []string{"PayoutsNeedingAttention"},
		Inject: func(ctx context.Context, e *env) error {
			e.set("ID", aheadPayout)
			return drive.FenceAhead(ctx, e.st.PaymentResourceURL(), e.st.RailDBURL(), aheadAccount, aheadPayout)
		},
		// Nothing heals it: the payout waits for a person, as the alert
		// says; the account is the fault's own.
		Confirms: map[string]string{"PayoutsNeedingAttention": aheadPayout + `[^\n]*` + string(payapi.ReasonRailFenceAhead)},
	},
	{
		// payment-resource's account fence of an account set above every
		// token lock-server has granted (drive.PaymentFenceAhead), then a payout
		// of it: the executor is refused FENCED_OUT at the claim, confirms
		// its lease, and its needs_attention mark is refused by the same
		// fence. The delivery is acknowledged and the payout stays
		// pending; only the executor's counter of unrecorded marks sees it.
		Name:     "payment-fence-ahead",
		Executes: true,
		Alerts:   []string{"PayoutAttentionUnrecorded"},
		Inject: func(ctx context.Context, e *env) error {
			e.set("ACCOUNT", payAheadAccount)
			return drive.PaymentFenceAhead(ctx, e.st.PaymentResourceURL(), e.st.PayDBURL(), payAheadAccount, payAheadPayout)
		},
		// Nothing heals it: the payout waits for a person; the account is
		// the fault's own.
		Confirms: map[string]string{"PayoutAttentionUnrecorded": payAheadAccount + ` fence=[0-9]+ [^\n]*FENCE AHEAD`},
	},
	{
		// rail-stub records the next submission and withholds its answer
		// until rail-proxy's rail timeout (5 s) gives up: rail-proxy
		// answers RAIL_AMBIGUOUS and the executor marks the payout
		// ambiguous. Nothing settles it until the heal asks the
		// reconciler for a pass; the alert needs the payout 60 s old (30
		// minutes at 1/30 scale) for 10 s.
		Name:         "payout-ambiguous",
		Executes:     true,
		Alerts:       []string{"PayoutAmbiguousTooLong"},
		AlertTimeout: 150 * time.Second,
		Inject: func(ctx context.Context, e *env) error {
			if err := setRailStubFaults(ctx, e.st.RailStubURL(), railstub.Faults{FailNext: 1, Mode: railstub.FaultHang}); err != nil {
				return err
			}
			// The runbook's $ID: the payout that became ambiguous.
			actx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			id, err := awaitPayoutIn(actx, e.st.PayDBURL(), payapi.StateAmbiguous, 1)
			if err != nil {
				return err
			}
			e.set("ID", id)
			return nil
		},
		Heal: func(ctx context.Context, e *env) error {
			_, err := drive.Reconcile(ctx, e.st.ReconcilerURL())
			return err
		},
		// The rail's record of it: recorded, the answer withheld.
		Confirms: map[string]string{"PayoutAmbiguousTooLong": `"withheld":true`},
	},
	{
		// rail-proxy killed while payouts are executed: payment-resource
		// still takes payouts, the executor claims each and cannot submit
		// it, and nothing completes. The completion SLO counts no event
		// and cannot burn; PayoutsNotCompleting pages, and the runbook's
		// count of unfinished payouts by state shows them claimed.
		Name:     "rail-proxy-down",
		Executes: true,
		Alerts:   []string{"PayoutsNotCompleting", "FunctionDown"},
		Inject: func(ctx context.Context, e *env) error {
			e.set("URL", e.st.RailProxyURL())
			return e.st.Kill("rail-proxy")
		},
		Heal: func(ctx context.Context, e *env) error { return e.st.Restart(ctx, "rail-proxy") },
		Confirms: map[string]string{
			"PayoutsNotCompleting": `claimed\s*\|\s*[1-9]`,
			"FunctionDown":         `curl exit 7\b`,
		},
	},
	{
		// The executor killed and kept down: every push is refused
		// (connection refused) until the bridge, after the subscription's
		// 10 delivery attempts (its backoff scaled down 50 times, about
		// 25 s), moves the message to the dead-letter topic. A crash loop
		// that answers no delivery looks the same to Pub/Sub.
		Name:     "executor-down",
		Executes: true,
		Alerts:   []string{"PayoutDeadLettered"},
		Inject:   func(ctx context.Context, e *env) error { return e.st.Kill("executor-A") },
		Heal:     func(ctx context.Context, e *env) error { return e.st.Restart(ctx, "executor-A") },
		// The bridge's failed pushes: no answer, connection refused.
		Confirms: map[string]string{"PayoutDeadLettered": `"status":0,"error":"[^\n]*connection refused`},
	},
	{
		// rail-stub killed and kept down: rail-proxy answers
		// RAIL_NOT_REACHED (nothing reached the rail), a transient refusal
		// the executor leaves for redelivery, until the messages run out
		// of delivery attempts and are dead-lettered.
		Name:     "rail-stub-down",
		Executes: true,
		Alerts:   []string{"PayoutDeadLettered"},
		Inject:   func(ctx context.Context, e *env) error { return e.st.Kill("rail-stub") },
		Heal:     func(ctx context.Context, e *env) error { return e.st.Restart(ctx, "rail-stub") },
		// The executor's reason for each failed delivery.
		Confirms: map[string]string{"PayoutDeadLettered": string(railapi.CodeRailNotReached)},
	},
	killed("reconciler-killed", "reconciler", "FunctionDown", true, func(st *stack.Stack) string { return st.ReconcilerURL() }),
	hung("reconciler-hung", "reconciler", true, func(st *stack.Stack) string { return st.ReconcilerURL() }),
	{
		// A payment the rail made that the books never debited: one
		// submission of a payout paydb does not know, straight to
		// rail-stub, past both fence points (a second, unfenced caller of
		// the rail), then a reconciler pass, whose cross audit reports it
		// (reconciler_audit_mismatches{kind="rail_payment_without_debit"},
		// and kind "violation" for the rules it breaks) after its second
		// look. Last of the executor path: the payment
		// stays in the rail's journal, so every later audit of the phase
		// reports it again.
		Name:     "rail-paid-no-debit",
		Executes: true,
		Alerts:   []string{"PayoutAuditMismatch"},
		Inject: func(ctx context.Context, e *env) error {
			e.set("ID", noDebitPayout)
			if err := railStubSubmit(ctx, e.st.RailStubURL(), noDebitPayout, noDebitAccount); err != nil {
				return err
			}
			_, err := drive.Reconcile(ctx, e.st.ReconcilerURL())
			return err
		},
		// Nothing heals it: money moved; the books need a person.
		// The runbook's pass names the payout under railPaidNoDebit.
		Confirms: map[string]string{"PayoutAuditMismatch": `"railPaidNoDebit":\[[^\]]*"` + noDebitPayout + `"`},
	},
	{
		// The etcd leader killed and restarted four times in a row, as
		// repeated evictions of the leader's pod would: each kill is an
		// election (lock-server on etcd sees a second of failed calls).
		Name:    "etcd-leader-churn",
		Backend: stack.BackendEtcd,
		Alerts:  []string{"EtcdLeaderChangesFrequent"},
		Inject:  func(ctx context.Context, e *env) error { return churnEtcdLeader(ctx, e.st, 4) },
		// Some member has seen more than its first leader.
		Confirms: map[string]string{"EtcdLeaderChangesFrequent": `(?m)etcd_server_leader_changes_seen_total ([2-9]|[1-9][0-9]+)$`},
	},
	{
		// Two of the three etcd members killed: the survivor has no
		// quorum, so no leader (etcd's CheckQuorum makes a leader step
		// down when it cannot hear a majority).
		Name:    "etcd-quorum-lost",
		Backend: stack.BackendEtcd,
		Alerts:  []string{"EtcdNoLeader"},
		Inject: func(ctx context.Context, e *env) error {
			return errors.Join(e.st.Kill("etcd-1"), e.st.Kill("etcd-2"))
		},
		Heal: func(ctx context.Context, e *env) error {
			return errors.Join(e.st.Restart(ctx, "etcd-1"), e.st.Restart(ctx, "etcd-2"))
		},
		Confirms: map[string]string{"EtcdNoLeader": `etcd_server_has_leader 0`},
	},
	{
		// One etcd member stopped: the other two keep the quorum; its
		// scrape waits out its timeout.
		Name:    "etcd-member-hung",
		Backend: stack.BackendEtcd,
		Alerts:  []string{"ProcessHung"},
		Inject: func(ctx context.Context, e *env) error {
			e.set("URL", e.st.EtcdEndpoints()[0])
			return e.st.Freeze("etcd-0")
		},
		Heal:     func(ctx context.Context, e *env) error { return e.st.Thaw("etcd-0") },
		Confirms: map[string]string{"ProcessHung": `curl exit 28\b`},
	},
}

// NotFiredLocally are the alerts of ops/slo.yaml that no fault of this
// game day fires, and why (TestEveryAlertIsFiredOrExplained).
var NotFiredLocally = map[string]string{
	"EtcdMemberDown": "etcd-member-hung and etcd-quorum-lost stop members, and their reports list " +
		"EtcdMemberDown among the other alerts received; the runbook's first diagnostic is kubectl, for GKE",
}

// killed is the fault of process (a stack.Stack name) killed and kept
// down until its heal restarts it; alert must page. url gives the
// process's base URL, the runbook's $URL.
func killed(name, process, alert string, executes bool, url func(*stack.Stack) string) Fault {
	return Fault{
		Name:     name,
		Executes: executes,
		Alerts:   []string{alert},
		Inject: func(ctx context.Context, e *env) error {
			e.set("URL", url(e.st))
			return e.st.Kill(process)
		},
		Heal:     func(ctx context.Context, e *env) error { return e.st.Restart(ctx, process) },
		Confirms: map[string]string{alert: `curl exit 7\b`},
	}
}

// hung is the fault of process stopped with SIGSTOP (alive, holding its
// port, answering nothing) until its heal resumes it; ProcessHung must
// page.
func hung(name, process string, executes bool, url func(*stack.Stack) string) Fault {
	return Fault{
		Name:     name,
		Executes: executes,
		Alerts:   []string{"ProcessHung"},
		Inject: func(ctx context.Context, e *env) error {
			e.set("URL", url(e.st))
			return e.st.Freeze(process)
		},
		Heal:     func(ctx context.Context, e *env) error { return e.st.Thaw(process) },
		Confirms: map[string]string{"ProcessHung": `curl exit 28\b`},
	}
}

func faultByName(name string) *Fault {
	for i := range Faults {
		if Faults[i].Name == name {
			return &Faults[i]
		}
	}
	return nil
}

// Run runs a game day: starts the stack and the monitoring, injects each
// fault of cfg in turn, and returns the report. It returns an error
// wrapping ErrNotFired (with the report) when an alert did not fire.
func Run(ctx context.Context, cfg Config) (Report, error) {
	rep := Report{Started: time.Now().UTC(), NotFiredLocally: NotFiredLocally}
	if err := cfg.Validate(); err != nil {
		return rep, err
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for _, bin := range []string{BinPrometheus, BinAlertmanager} {
		if _, err := exec.LookPath(bin); err != nil {
			return rep, fmt.Errorf("%w: %s is not on PATH (apt-get install %s)", ErrPrerequisite, bin, debianPackage(bin))
		}
	}
	if err := stack.CheckPostgres(); err != nil {
		return rep, fmt.Errorf("%w: %w", ErrPrerequisite, err)
	}
	faults := cfg.Faults
	if len(faults) == 0 {
		for _, f := range Faults {
			faults = append(faults, f.Name)
		}
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return rep, err
	}
	bin, err := stack.CachedBinaries(ctx)
	if err != nil {
		return rep, err
	}
	var mon *monitor
	defer func() {
		if mon != nil {
			mon.stop()
		}
	}()
	for _, ph := range phasesOf(faults) {
		rs, err := runPhase(ctx, cfg, bin, &mon, ph, log)
		rep.Results = append(rep.Results, rs...)
		if err != nil {
			return rep, err
		}
	}
	return rep, verdict(&rep)
}

// verdict fills rep's NotFired and NotConfirmed from its results and
// returns the game day's error: ErrNotFired for an alert that did not
// fire, ErrNotConfirmed for one whose runbook step did not name the
// cause (both joined), nil when every alert fired and was confirmed.
func verdict(rep *Report) error {
	for _, r := range rep.Results {
		if !r.Fired {
			rep.NotFired = append(rep.NotFired, r.Alert)
		} else if !r.RunbookConfirms {
			rep.NotConfirmed = append(rep.NotConfirmed, r.Alert+"/"+r.Fault)
		}
	}
	var errs []error
	if len(rep.NotFired) > 0 {
		errs = append(errs, fmt.Errorf("%w: %s", ErrNotFired, strings.Join(rep.NotFired, ", ")))
	}
	if len(rep.NotConfirmed) > 0 {
		errs = append(errs, fmt.Errorf("%w: %s", ErrNotConfirmed, strings.Join(rep.NotConfirmed, ", ")))
	}
	return errors.Join(errs...)
}

// phase is the faults run on one stack: those of one lock-server backend,
// and, for the PostgreSQL backend, whether payouts are executed.
type phase struct {
	backend  string
	executes bool
	links    bool
	faults   []*Fault
}

// expected are the alerts ph fires by design, with or without a fault:
// a phase without the executor path creates payouts (the steady load) and
// completes none, so PayoutsNotCompleting pages as it would for a real
// outage. The alert stays as it is; the report keeps it out of "also
// fired" there.
func (ph phase) expected() []string {
	if ph.executes {
		return nil
	}
	return []string{"PayoutsNotCompleting"}
}

// phasesOf groups the faults into phases, keeping their order within
// each: PostgreSQL, then PostgreSQL with the executor path (Fault.Executes),
// then etcd. Each group runs on a stack of its own.
func phasesOf(names []string) []phase {
	pg := phase{backend: stack.BackendPostgres}
	pay := phase{backend: stack.BackendPostgres, executes: true}
	etcd := phase{backend: stack.BackendEtcd}
	net := phase{backend: stack.BackendPostgres, executes: true, links: true}
	for _, n := range names {
		f := faultByName(n)
		switch {
		case f.Links:
			net.faults = append(net.faults, f)
		case f.Backend == stack.BackendEtcd:
			etcd.faults = append(etcd.faults, f)
		case f.Executes:
			pay.faults = append(pay.faults, f)
		default:
			pg.faults = append(pg.faults, f)
		}
	}
	var out []phase
	for _, ph := range []phase{pg, pay, etcd, net} {
		if len(ph.faults) > 0 {
			out = append(out, ph)
		}
	}
	return out
}

// runPhase starts the stack of ph (the etcd backend runs three etcd
// members, each scraped), starts the monitoring (*mon nil) or points it
// at the new stack (a reload of Prometheus), keeps the steady load on it,
// and runs ph's faults in turn. The stack is stopped when it returns.
func runPhase(ctx context.Context, cfg Config, bin string, mon **monitor, ph phase, log *slog.Logger) ([]Result, error) {
	name := ph.backend
	if ph.executes {
		name += "-payouts"
	}
	if ph.links {
		name += "-links"
	}
	scfg := stack.Config{Backend: ph.backend, PaymentFencing: true, RailFencing: true,
		Executors: []stack.ExecutorSpec{{Name: "A"}}, Dir: filepath.Join(cfg.Dir, "stack-"+name), BinDir: bin, Log: log,
		RailJournal: true, // PayoutSubmittedTwice's runbook reads the rail's journal
		Links:       ph.links}
	if ph.backend == stack.BackendEtcd {
		scfg.EtcdMembers = 3
	}
	if ph.executes {
		// The reconciler settles ambiguous payouts: it must not settle
		// the one payout-ambiguous makes before its alert fires, so it
		// runs a pass only when the fault's heal asks for one.
		scfg.ReconcileEvery = time.Hour
	}
	d, err := drive.Start(ctx, scfg)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	st := d.Stack()
	var br *bridge
	if ph.executes {
		if br, err = startBridge(ctx, st); err != nil {
			return nil, err
		}
		defer br.stop() // before st.Stop: the bridges use its Pub/Sub
	}
	hostOf := func(u string) string { return strings.TrimPrefix(strings.TrimPrefix(u, "http://"), "https://") }
	targets := []Target{
		{Job: "lock-server", Addr: hostOf(st.LockServerURL())},
		// Its /metrics reads two ages from paydb, waiting up to 2 s
		// (paymentresource.ageTimeout): with the global 900 ms timeout a
		// frozen paydb would fail the whole scrape and hide the
		// payout API's 5xx and paymentresource_db_stalled with it.
		{Job: "payment-resource", Addr: hostOf(st.PaymentResourceURL()), Interval: 3 * time.Second},
		{Job: "rail-proxy", Addr: hostOf(st.RailProxyURL())},
		{Job: "rail-stub", Addr: hostOf(st.RailStubURL())},
		{Job: "executor", Addr: hostOf(st.ExecutorURL("A"))},
	}
	for _, ep := range st.EtcdEndpoints() {
		// Embedded etcd serves its metrics on the client URL.
		targets = append(targets, Target{Job: "etcd", Addr: hostOf(ep)})
	}
	if br != nil {
		targets = append(targets, Target{Job: "push-bridge", Addr: br.addr})
	}
	if ph.executes {
		// reconciler_audit_mismatches, PayoutAuditMismatch's gauge.
		targets = append(targets, Target{Job: "reconciler", Addr: hostOf(st.ReconcilerURL())})
	}
	rules := filepath.Join(cfg.Repo, "ops/prometheus/gameday/rules.yml")
	if *mon == nil {
		m, err := startMonitor(ctx, cfg.Dir, rules, targets) // stopped by itself on error
		if err != nil {
			return nil, err
		}
		*mon = m
	} else if err := (*mon).retarget(rules, targets); err != nil {
		return nil, err
	}
	m := *mon
	// Every target scraped once, so that absent() and rates have data.
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	for _, t := range targets {
		if err := m.awaitQuery(wctx, fmt.Sprintf(`up{job=%q,instance=%q} == 1`, t.Job, t.Addr)); err != nil {
			cancel()
			return nil, err
		}
	}
	cancel()
	e := &env{st: st, vars: map[string]string{
		"LS": st.LockServerURL(), "PAY": st.PaymentResourceURL(), "PROXY": st.RailProxyURL(), "STUB": st.RailStubURL(),
		config.EnvLockDBURL: st.LockDBURL(), payapi.EnvDatabaseURL: st.PayDBURL(), railapi.EnvDatabaseURL: st.RailDBURL(),
		"ETCD":              strings.Join(st.EtcdEndpoints(), ","),
		"RAIL_STUB_JOURNAL": filepath.Join(st.Dir(), "rail-stub.journal.jsonl"), // where local/stack keeps it
		"PATH":              bin + string(os.PathListSeparator) + os.Getenv("PATH"),
	}}
	if br != nil {
		// PayoutDeadLettered's runbook reads the bridges' log and the
		// executor's (local/stack names it after the executor).
		e.vars["PUSH_LOG"] = br.logPath
		e.vars["EXECUTOR_LOG"] = filepath.Join(st.Dir(), "executor-A.log")
		e.vars["RECONCILER"] = st.ReconcilerURL()
	}
	lctx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { load(lctx, st.LockServerURL()) }) // ends with lctx
	defer func() { stopLoad(); wg.Wait() }()
	if err := payoutLoadSetup(ctx, d); err != nil {
		return nil, err
	}
	wg.Go(func() { payoutLoad(lctx, d) }) // ends with lctx
	defer func() { _ = e.stopBackground() }()
	// A few seconds of healthy traffic before the first fault: the burn
	// rules need a total to divide by.
	healthy := []string{
		`sum(rate(lockserver_requests_total{op="acquire"}[10s])) > 0`,
		`sum(rate(function_requests_total{function="payment-resource",route=~"` + payapi.PathPayouts + `.*"}[10s])) > 0`,
	}
	if ph.executes {
		// Payouts executed and posted: the completion SLO has a total.
		healthy = append(healthy, `sum(rate(payout_completion_seconds_count[10s])) > 0`)
	}
	for _, q := range healthy {
		if err := m.awaitQuery(ctx, q); err != nil {
			return nil, err
		}
	}
	var out []Result
	for _, f := range ph.faults {
		rs, err := runFault(ctx, cfg, e, m, f, ph.expected(), log)
		out = append(out, rs...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// runFault injects f, awaits each of its alerts and runs their runbook
// steps, then heals. expected are the alerts f's phase fires by design.
func runFault(ctx context.Context, cfg Config, e *env, mon *monitor, f *Fault, expected []string, log *slog.Logger) ([]Result, error) {
	// None of the fault's alerts may be pending or firing already (a slow
	// scrape on a loaded machine makes up 0 for a moment): the detection
	// latency would then be shorter than the rule's "for".
	qctx, cancel := context.WithTimeout(ctx, cfg.AlertTimeout)
	quiet := fmt.Sprintf(`absent(ALERTS{alertname=~%q})`, strings.Join(f.Alerts, "|"))
	if f.Severity != "" {
		quiet = fmt.Sprintf(`absent(ALERTS{alertname=~%q,severity=%q})`, strings.Join(f.Alerts, "|"), f.Severity)
	}
	err := mon.awaitQuery(qctx, quiet)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("fault %s: its alerts were already pending or firing before it: %w", f.Name, err)
	}
	mon.recv.reset()
	log.Info("fault injected", "event", EventFaultInjected, "fault", f.Name)
	injected := time.Now()
	if err := f.Inject(ctx, e); err != nil {
		return nil, fmt.Errorf("fault %s: inject: %w", f.Name, err)
	}
	var out []Result
	for _, alert := range f.Alerts {
		r := Result{Alert: alert, Fault: f.Name}
		deadline := time.Now().Add(cfg.AlertTimeout)
		if d := injected.Add(f.AlertTimeout); d.After(deadline) {
			deadline = d
		}
		actx, cancel := context.WithDeadline(ctx, deadline)
		key := alert
		if f.Severity != "" {
			key += "/" + f.Severity
		}
		at, err := mon.recv.await(actx, key)
		cancel()
		if err == nil {
			r.Fired = true
			r.DetectionMs = at.Sub(injected).Milliseconds()
			log.Info("alert received", "event", EventAlertReceived, "fault", f.Name, "alert", alert, "detectionMs", r.DetectionMs)
			cmd, err := runbookCommand(cfg.Repo, alert)
			if err != nil {
				return append(out, r), err
			}
			r.RunbookCommand = cmd
			e.mu.Lock()
			vars := make([]string, 0, len(e.vars))
			for k, v := range e.vars {
				vars = append(vars, k+"="+v)
			}
			e.mu.Unlock()
			rctx, cancel := context.WithTimeout(ctx, cfg.RunbookTimeout)
			c := exec.CommandContext(rctx, "bash", "-c", cmd)
			c.Env = append(os.Environ(), vars...)
			var buf bytes.Buffer
			c.Stdout, c.Stderr = &buf, &buf
			runErr := c.Run()
			cancel()
			r.RunbookMs = time.Since(at).Milliseconds()
			if ee := (*exec.ExitError)(nil); errors.As(runErr, &ee) {
				r.RunbookExit = ee.ExitCode()
			} else if runErr != nil {
				r.RunbookExit = -1
			}
			r.RunbookConfirms = regexp.MustCompile(f.Confirms[alert]).Match(buf.Bytes())
			r.RunbookOutput = lastLines(buf.String(), 6)
		} else {
			log.Warn("alert not received", "event", EventAlertMissing, "fault", f.Name, "alert", alert)
		}
		out = append(out, r)
	}
	also, byPhase := otherAlerts(mon.recv.received(), f.Alerts, expected)
	for i := range out {
		out[i].AlsoFired, out[i].ExpectedFired = also, byPhase
	}
	if f.Heal != nil {
		if err := f.Heal(ctx, e); err != nil {
			return out, fmt.Errorf("fault %s: heal: %w", f.Name, err)
		}
	}
	return out, nil
}

// otherAlerts splits the alerts received (by name; a "name/severity" key
// is a second entry of the same alert) that are not the fault's own into
// those its phase fires by design (expected) and the rest, each sorted.
func otherAlerts(received map[string]time.Time, own, expected []string) (also, byPhase []string) {
	for name := range received {
		switch {
		case strings.Contains(name, "/") || contains(own, name):
		case contains(expected, name):
			byPhase = append(byPhase, name)
		default:
			also = append(also, name)
		}
	}
	slices.Sort(also)
	slices.Sort(byPhase)
	return also, byPhase
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// lastLines is the last n lines of s (a command's answer ends with its
// verdict).
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// RunbookPath is the runbook of alert: docs/runbooks/<alert in kebab
// case>.md (LockServerDown -> lock-server-down.md), as ops/slo names it.
func RunbookPath(alert string) string {
	return filepath.Join("docs", "runbooks", slo.Kebab(alert)+".md")
}

var firstDiagnostic = regexp.MustCompile("(?s)## First diagnostic.*?```sh\n(.*?)```")

// runbookCommand returns the first sh block under "First diagnostic" of
// alert's runbook.
func runbookCommand(repo, alert string) (string, error) {
	b, err := os.ReadFile(filepath.Join(repo, RunbookPath(alert)))
	if err != nil {
		return "", err
	}
	m := firstDiagnostic.FindSubmatch(b)
	if m == nil {
		return "", fmt.Errorf("%s: no sh block under \"First diagnostic\"", RunbookPath(alert))
	}
	return strings.TrimSpace(string(m[1])), nil
}

// load sends a steady stream of acquires of one key (a grant, then clean
// LOCK_HELD answers: both good events of the availability SLO) and
// readiness probes (LockStoreUnreachable reads them, as Kubernetes'
// probes would feed it), until ctx ends.
func load(ctx context.Context, lockURL string) {
	client := &http.Client{Timeout: 2 * time.Second}
	body, _ := json.Marshal(lockapi.AcquireRequest{Owner: "gameday-load", TTLMs: 60_000})
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, lockURL+lockapi.PathLockPrefix+loadKey+"/acquire", bytes.NewReader(body))
		if err == nil {
			req.Header.Set("Content-Type", "application/json")
			if resp, err := client.Do(req); err == nil {
				resp.Body.Close()
			}
		}
		if n%3 == 0 {
			if req, err := http.NewRequestWithContext(ctx, http.MethodGet, lockURL+lockapi.PathReady, nil); err == nil {
				if resp, err := client.Do(req); err == nil {
					resp.Body.Close()
				}
			}
		}
	}
}

// Table is the report as a Markdown table, one row per alert, then the
// alerts not fired locally.
func Table(rep Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| Alert | Fault injected | Fired | Detection (fault → alert received) | Time to runbook step (alert → first diagnostic answered) | Runbook answer names the cause | Also fired |\n|---|---|---|---|---|---|---|\n")
	for _, r := range rep.Results {
		det, step := "—", "—"
		if r.Fired {
			det = fmt.Sprintf("%.1f s", float64(r.DetectionMs)/1000)
			step = fmt.Sprintf("%.1f s (exit %d)", float64(r.RunbookMs)/1000, r.RunbookExit)
		}
		fmt.Fprintf(&b, "| `%s` | %s | %v | %s | %s | %v | %s |\n", r.Alert, r.Fault, r.Fired, det, step, r.RunbookConfirms, strings.Join(r.AlsoFired, ", "))
	}
	return b.String()
}
