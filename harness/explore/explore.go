// Package explore is a schedule explorer for the payout pipeline: it runs
// two or three executors on the same payout, on the real code of every
// service, and decides, one step at a time, which of them moves next and
// when a lease ends behind its holder's back. After each schedule it
// judges the outcome from the rail's journal, raildb and paydb
// (payoutaudit), never from what the workers reported.
//
// # How the steps are held
//
// Each executor sends every request through a transport owned by the
// explorer. A request that writes or decides (acquire, lease confirmation,
// claim, rail attempt look-up, submission, report, release) stops in that
// transport until the explorer lets it go; so does rail-proxy's call to
// the rail, held in front of the rail-stub. Everything between two held
// points runs to completion before the explorer chooses again, and only
// one executor runs at a time, so a schedule is a sequence of choices and
// is replayed exactly from it. A request held in the transport has not
// reached its server yet: holding it is the network delaying it, as long
// as the explorer likes. The read of the payout that every execution
// starts with is not held: the facts it reads never change.
//
// Between two steps the explorer may also inject a fault on the payout's
// lock key:
//
//   - expire: the lock store's clock jumps past the TTL, so the live lease
//     ends on the server while its holder's local deadline (on the real
//     clock, ten minutes away) still says it holds: a paused process, a
//     lost renewal, an etcd lease revoked by id, or lockdb's clock stepping
//     forward all look like this to the pipeline;
//   - revoke: an operator's revoke of the live lease, acknowledged.
//
// A duplicate delivery is one more executor: the schedule decides when
// each one starts acquiring. An acquire is only let go when the key is
// free (a refused acquire changes nothing and is retried), so a schedule
// never waits on the real clock.
//
// # What is checked after each schedule
//
// After the scheduled executors are done, one more delivery runs to the
// end unscheduled (Pub/Sub redelivers until a 2xx), then:
//
//   - INV-04 and INV-05 across the records (payoutaudit.Run on the payout):
//     at most one rail submission, rail acknowledgements equal to ledger
//     debits, every submission through rail-proxy, the recorded token the
//     one that reached the rail, nothing left unreconciled;
//   - INV-02: the tokens of successive grants strictly increase;
//   - INV-03: rail-proxy forwarded the account's submissions in strictly
//     increasing token order, and the payout's fenced writes never went
//     back to a lower token;
//   - revoke takes effect: when the server ended a holder's lease (expire
//     or revoke) before the holder's last lease check preceding its
//     submission, that submission never reached the rail. The last check
//     is the holder's last confirmation with lock-server, or, for an
//     executor that only checks its local deadline, the submission itself.
//
// INV-01 and INV-06 are properties of the lock service alone; they are
// checked by lockserver/store/storetest (linearizability) and the SDK's
// simulation, not here.
package explore

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/pipelinetest"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
)

// Steps: the points where an executor is held, named by what happens
// when it is let go.
const (
	StepAcquire = "acquire" // the acquire request reaches lock-server
	StepConfirm = "confirm" // a lease confirmation (renew) reaches lock-server
	StepClaim   = "claim"   // the claim reaches payment-resource
	StepLookup  = "lookup"  // a rail attempt look-up reaches rail-proxy
	StepSubmit  = "submit"  // the submission reaches rail-proxy
	StepRail    = "rail"    // rail-proxy's call reaches the rail
	StepReport  = "report"  // the result reaches payment-resource
	StepRelease = "release" // the release reaches lock-server
	stepDone    = "done"
)

// Faults the explorer injects between steps.
const (
	// FaultExpire ends the live lease on the server's clock.
	FaultExpire = "expire"
	// FaultRevoke revokes the live lease, as an operator would.
	FaultRevoke = "revoke"
)

// Bounds of a schedule.
const (
	// MaxHolders is the most executors a schedule runs.
	MaxHolders = 3
	// ttl is every lease's TTL: longer than any schedule, so that only the
	// explorer's faults end a lease, and no background renewal runs.
	ttl = 10 * time.Minute
)

// Choice is one decision of a schedule: let a holder's step go, or inject
// a fault.
type Choice struct {
	// Holder is the executor moved ("A", "B", "C"), "" for a fault.
	Holder string
	// Step is the step it takes (a Step constant), or the fault (a Fault
	// constant).
	Step string
}

// String is "A:claim" for a step, the fault's name for a fault.
func (c Choice) String() string {
	if c.Holder == "" {
		return c.Step
	}
	return c.Holder + ":" + c.Step
}

// Schedule is a sequence of choices, written as their Strings separated
// by spaces.
type Schedule []Choice

// String writes s as ParseSchedule reads it.
func (s Schedule) String() string {
	parts := make([]string, len(s))
	for i, c := range s {
		parts[i] = c.String()
	}
	return strings.Join(parts, " ")
}

// ParseSchedule reads a schedule written by Schedule.String.
func ParseSchedule(text string) (Schedule, error) {
	var s Schedule
	for _, f := range strings.Fields(text) {
		h, step, ok := strings.Cut(f, ":")
		switch {
		case !ok && (f == FaultExpire || f == FaultRevoke):
			s = append(s, Choice{Step: f})
		case ok && len(h) == 1 && h[0] >= 'A' && h[0] < 'A'+MaxHolders:
			s = append(s, Choice{Holder: h, Step: step})
		default:
			return nil, fmt.Errorf("explore: bad choice %q", f)
		}
	}
	return s, nil
}

// Config bounds the schedules explored.
type Config struct {
	// Holders is how many executors run, 1..MaxHolders.
	Holders int
	// MaxFaults is how many faults a schedule may inject.
	MaxFaults int
	// Faults are the kinds injected (FaultExpire, FaultRevoke).
	Faults []string
}

// Result is the outcome of one schedule.
type Result struct {
	// Schedule is the sequence of choices made.
	Schedule Schedule
	// Violations lists every broken check, one line each; empty when the
	// schedule passed.
	Violations []string
	// Checks names the checks broken (a Check constant each), sorted.
	Checks []string
}

// Names of the checks, as Result.Checks lists them.
const (
	// CheckAudit: payoutaudit found a violation (INV-04, INV-05).
	CheckAudit = "audit"
	// CheckRailOnce: the rail received the payout more than once (INV-04);
	// also reported under CheckAudit.
	CheckRailOnce = "rail-once"
	// CheckTokens: grant tokens did not strictly increase (INV-02).
	CheckTokens = "grant-tokens"
	// CheckFences: a fence point accepted a lower token (INV-03).
	CheckFences = "fences"
	// CheckEndedLease: a submission reached the rail although the server
	// had ended its holder's lease before the holder's last check.
	CheckEndedLease = "ended-lease"
)

// Explorer runs schedules against one pipeline. Each schedule has its own
// payout and account, so schedules never see each other's records.
type Explorer struct {
	p    *pipelinetest.Pipeline
	log  *slog.Logger
	seq  atomic.Int64
	runs sync.Map // payout id -> *run, for the rail hook
}

// New starts a pipeline (pipelinetest.Start with opts, its RailHandler
// replaced by the explorer's) and returns an Explorer over it.
func New(t testing.TB, opts pipelinetest.Options) *Explorer {
	t.Helper()
	e := &Explorer{log: opts.Log}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	opts.RailHandler = e.holdRail
	e.p = pipelinetest.Start(t, opts)
	return e
}

// arrival is an executor stopped at a step, or done.
type arrival struct {
	holder int
	step   string
	resume chan struct{} // closed to let the step go; nil when done
	err    error         // when done
}

// stepRecord is one step taken, for the checks.
type stepRecord struct {
	index  int // position in the schedule
	holder int
	step   string
}

// run is one schedule in progress.
type run struct {
	e       *Explorer
	event   payoutevent.Event
	arrive  chan arrival
	running atomic.Int32 // the holder let go last; -1 when unscheduled

	mu     sync.Mutex
	grants []int64 // tokens granted, in order
	tokens map[int]int64
}

// holdRail wraps the rail: a call for a payout under exploration stops
// until the explorer lets it go, as a step of the holder that is running.
func (e *Explorer) holdRail(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var req struct {
			PayoutID string `json:"payoutId"`
		}
		_ = json.Unmarshal(body, &req)
		if v, ok := e.runs.Load(req.PayoutID); ok {
			run := v.(*run)
			if h := int(run.running.Load()); h >= 0 {
				a := arrival{holder: h, step: StepRail, resume: make(chan struct{})}
				run.arrive <- a
				<-a.resume
			}
		}
		next.ServeHTTP(w, r)
	})
}

// doer is one executor's transport: it holds each deciding request until
// the explorer lets it go.
type doer struct {
	r      *run
	holder int // -1: never held
}

func stepOf(req *http.Request) string {
	p := req.URL.Path
	switch {
	case req.Method == http.MethodGet:
		if p == railapi.PathAttempts {
			return StepLookup
		}
		return ""
	case strings.HasPrefix(p, api.PathLockPrefix) && strings.HasSuffix(p, api.SuffixAcquire):
		return StepAcquire
	case strings.HasPrefix(p, api.PathLockPrefix) && strings.HasSuffix(p, api.SuffixRenew):
		return StepConfirm
	case strings.HasPrefix(p, api.PathLockPrefix) && strings.HasSuffix(p, api.SuffixRelease):
		return StepRelease
	case strings.HasSuffix(p, "/claim"):
		return StepClaim
	case strings.HasSuffix(p, "/result"):
		return StepReport
	case p == railapi.PathSubmissions:
		return StepSubmit
	}
	return ""
}

func (d *doer) Do(req *http.Request) (*http.Response, error) {
	step := stepOf(req)
	if d.holder >= 0 && step != "" {
		a := arrival{holder: d.holder, step: step, resume: make(chan struct{})}
		d.r.arrive <- a
		<-a.resume
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil || step != StepAcquire || resp.StatusCode != http.StatusOK {
		return resp, err
	}
	// Note the grant's token, for the checks, and hand the body on.
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	var g api.Grant
	if json.Unmarshal(body, &g) == nil {
		d.r.mu.Lock()
		d.r.grants = append(d.r.grants, g.Token)
		if d.holder >= 0 {
			d.r.tokens[d.holder] = g.Token
		}
		d.r.mu.Unlock()
	}
	return resp, nil
}

// Chooser picks one of enabled (never empty) at a decision; depth counts
// the decisions made before it in the schedule.
type Chooser func(depth int, enabled []Choice) (int, error)

func holderName(h int) string { return string(rune('A' + h)) }

func (r *run) executor(owner string, d *doer) (*executor.Executor, error) {
	cfg := executor.DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL = r.e.p.LockURL, r.e.p.PayURL, r.e.p.ProxyURL
	cfg.Owner, cfg.LeaseTTL = owner, ttl
	cfg.AcquireWait, cfg.RequestTimeout, cfg.RailTimeout = 5*time.Minute, 5*time.Minute, 5*time.Minute
	return executor.New(cfg, r.e.log.With("service", "executor", "worker", owner), executor.WithHTTPClient(d))
}

// Run runs one schedule of cfg, asking choose at each decision, and checks
// its outcome. The error is the explorer's own (a service that failed, a
// nondeterministic replay), never a broken check.
func (e *Explorer) Run(ctx context.Context, cfg Config, choose Chooser) (Result, error) {
	if cfg.Holders < 1 || cfg.Holders > MaxHolders {
		return Result{}, fmt.Errorf("explore: %d holders; want 1..%d", cfg.Holders, MaxHolders)
	}
	n := e.seq.Add(1)
	r := &run{e: e, arrive: make(chan arrival), tokens: map[int]int64{},
		event: payoutevent.Event{PayoutID: fmt.Sprintf("p-%d", n), AccountID: fmt.Sprintf("acct-%d", n), AmountMinor: 2500, Currency: "EUR"}}
	r.running.Store(-1)
	if err := e.p.CreatePayout(ctx, r.event); err != nil {
		return Result{}, err
	}
	e.runs.Store(r.event.PayoutID, r)
	defer e.runs.Delete(r.event.PayoutID)

	pending := map[int]arrival{}
	for h := range cfg.Holders {
		x, err := r.executor(holderName(h), &doer{r: r, holder: h})
		if err != nil {
			return Result{}, err
		}
		go func() {
			_, err := x.Execute(ctx, r.event)
			r.arrive <- arrival{holder: h, step: stepDone, err: err}
		}()
	}
	for len(pending) < cfg.Holders {
		a := <-r.arrive
		pending[a.holder] = a
	}
	var (
		res    Result
		steps  []stepRecord
		ended  []endedLease
		faults int
	)
	key := r.event.LockKey()
	for {
		state, err := e.p.Locks.Inspect(ctx, key)
		if err != nil {
			return res, err
		}
		live := state.Lease != nil
		var enabled []Choice
		waiting := false
		for h := range cfg.Holders {
			a := pending[h]
			switch {
			case a.step == stepDone:
			case a.step == StepAcquire && live:
				waiting = true
			default:
				enabled = append(enabled, Choice{Holder: holderName(h), Step: a.step})
			}
		}
		if live && faults < cfg.MaxFaults {
			for _, f := range cfg.Faults {
				enabled = append(enabled, Choice{Step: f})
			}
		}
		if len(enabled) == 0 {
			if !waiting {
				break
			}
			// Everyone left waits for a lease whose holder is done (its
			// release failed): it ends by its TTL. Not a fault.
			enabled = append(enabled, Choice{Step: FaultExpire})
			faults--
		}
		i, err := choose(len(res.Schedule), enabled)
		if err != nil {
			return res, err
		}
		c := enabled[i]
		res.Schedule = append(res.Schedule, c)
		if c.Holder == "" {
			faults++
			var tok int64
			switch c.Step {
			case FaultExpire:
				tok = state.Lease.Token
				e.p.LockClock.Advance(ttl + time.Millisecond)
			case FaultRevoke:
				l, err := e.p.Locks.Revoke(ctx, key, 0)
				if err != nil {
					return res, fmt.Errorf("explore: revoke: %w", err)
				}
				tok = l.Token
			}
			ended = append(ended, endedLease{index: len(res.Schedule) - 1, token: tok})
			continue
		}
		h := int(c.Holder[0] - 'A')
		steps = append(steps, stepRecord{index: len(res.Schedule) - 1, holder: h, step: c.Step})
		r.running.Store(int32(h))
		close(pending[h].resume)
		select {
		case a := <-r.arrive:
			if a.holder != h {
				return res, fmt.Errorf("explore: %s arrived while %s was running", holderName(a.holder), c.Holder)
			}
			pending[h] = a
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}
	r.running.Store(-1)
	if err := r.finish(ctx); err != nil {
		return res, err
	}
	return res, r.check(ctx, &res, steps, ended)
}

// endedLease is a fault: the lease carrying token ended on the server at
// schedule position index.
type endedLease struct {
	index int
	token int64
}

// finish lets Pub/Sub redeliver the event to one more, unscheduled,
// executor until an answer would be acknowledged.
func (r *run) finish(ctx context.Context) error {
	if s, err := r.e.p.Locks.Inspect(ctx, r.event.LockKey()); err != nil {
		return err
	} else if s.Lease != nil {
		r.e.p.LockClock.Advance(ttl + time.Millisecond)
	}
	x, err := r.executor("Z", &doer{r: r, holder: -1})
	if err != nil {
		return err
	}
	var err2 error
	for range 3 {
		out, err := x.Execute(ctx, r.event)
		if executor.Status(out, err) == http.StatusOK {
			return nil
		}
		err2 = err
	}
	return fmt.Errorf("explore: the last delivery of %s never ended: %w", r.event.PayoutID, err2)
}

// check fills res.Violations from the records.
func (r *run) check(ctx context.Context, res *Result, steps []stepRecord, ended []endedLease) error {
	res.Violations = []string{}
	broken := map[string]bool{}
	fail := func(check, format string, args ...any) {
		broken[check] = true
		res.Violations = append(res.Violations, check+": "+fmt.Sprintf(format, args...))
	}
	rep, err := r.e.p.Audit(ctx, r.event.PayoutID)
	if err != nil {
		return err
	}
	for _, v := range rep.Violations {
		fail(CheckAudit, "%s", v)
		if v.Check == "rail_at_most_once_per_payout" {
			broken[CheckRailOnce] = true
		}
	}
	if len(rep.Unreconciled) > 0 {
		fail(CheckAudit, "payout left unreconciled: %v", rep.Unreconciled)
	}

	r.mu.Lock()
	grants := slices.Clone(r.grants)
	tokens := r.tokens
	r.mu.Unlock()
	for i := 1; i < len(grants); i++ {
		if grants[i] <= grants[i-1] {
			fail(CheckTokens, "grant %d has token %d after %d", i, grants[i], grants[i-1])
		}
	}

	// Fence point two: forwarded tokens strictly increase per account.
	rows, err := r.e.p.RailDB.Query(ctx, `SELECT token, state FROM rail_attempt WHERE account_id = $1 ORDER BY attempt_id`, r.event.AccountID)
	if err != nil {
		return err
	}
	var (
		last      int64
		forwarded = map[int64]bool{}
	)
	for rows.Next() {
		var tok int64
		var state string
		if err := rows.Scan(&tok, &state); err != nil {
			rows.Close()
			return err
		}
		if s := railapi.State(state); s == railapi.StateFenced || s == railapi.StateDuplicate {
			continue
		}
		forwarded[tok] = true
		if tok <= last {
			fail(CheckFences, "rail-proxy forwarded token %d after %d", tok, last)
		}
		last = tok
	}
	if err := rows.Err(); err != nil {
		return err
	}
	// Fence point one: the payout's fenced writes never go back.
	rows, err = r.e.p.PayDB.Query(ctx, `SELECT token FROM payout_transition WHERE payout_id = $1 AND token IS NOT NULL ORDER BY transition_id`, r.event.PayoutID)
	if err != nil {
		return err
	}
	last = 0
	for rows.Next() {
		var tok int64
		if err := rows.Scan(&tok); err != nil {
			rows.Close()
			return err
		}
		if tok < last {
			fail(CheckFences, "payment-resource accepted a write of the payout with token %d after %d", tok, last)
		}
		last = tok
	}
	if err := rows.Err(); err != nil {
		return err
	}

	// A lease the server ended before its holder's last check stops the
	// holder's submission.
	for _, end := range ended {
		for h, tok := range tokens {
			if tok != end.token || !forwarded[tok] {
				continue
			}
			check := -1
			for _, s := range steps {
				if s.holder != h {
					continue
				}
				if s.step == StepConfirm {
					check = s.index
				}
				if s.step == StepSubmit {
					if check < 0 {
						check = s.index // only a local check, made as it sent
					}
					break
				}
			}
			if check > end.index {
				fail(CheckEndedLease, "%s's lease (token %d) ended at step %d, before its last check at step %d, yet its submission reached the rail",
					holderName(h), tok, end.index, check)
			}
		}
	}
	for c := range broken {
		res.Checks = append(res.Checks, c)
	}
	slices.Sort(res.Checks)
	return nil
}

// Replay runs the schedule s: at each decision it takes the choice s names,
// and fails if that choice is not enabled then (the code under test no
// longer has that step).
func (e *Explorer) Replay(ctx context.Context, cfg Config, s Schedule) (Result, error) {
	return e.Run(ctx, cfg, func(depth int, enabled []Choice) (int, error) {
		if depth >= len(s) {
			return 0, fmt.Errorf("explore: the schedule ends after %d choices, the run goes on (enabled %v)", len(s), enabled)
		}
		if i := slices.Index(enabled, s[depth]); i >= 0 {
			return i, nil
		}
		return 0, fmt.Errorf("explore: choice %d (%s) is not enabled; enabled: %v", depth, s[depth], enabled)
	})
}

// Exhaustive runs every schedule of cfg, depth first, calling visit with
// each result; it stops early when visit returns false. It returns the
// number of schedules run.
func (e *Explorer) Exhaustive(ctx context.Context, cfg Config, visit func(Result) bool) (int, error) {
	type node struct{ width, pick int }
	var path []node
	count := 0
	for {
		depth := 0
		res, err := e.Run(ctx, cfg, func(d int, enabled []Choice) (int, error) {
			depth = d + 1
			if d < len(path) {
				if path[d].width != len(enabled) {
					return 0, fmt.Errorf("explore: replay diverged at choice %d: %d choices, %d before", d, len(enabled), path[d].width)
				}
				return path[d].pick, nil
			}
			path = append(path, node{width: len(enabled)})
			return 0, nil
		})
		if err != nil {
			return count, fmt.Errorf("%w (schedule %s)", err, res.Schedule)
		}
		count++
		if !visit(res) {
			return count, nil
		}
		path = path[:depth]
		for len(path) > 0 && path[len(path)-1].pick+1 >= path[len(path)-1].width {
			path = path[:len(path)-1]
		}
		if len(path) == 0 {
			return count, nil
		}
		path[len(path)-1].pick++
	}
}

// Sample runs n schedules of cfg chosen uniformly at each decision by a
// generator seeded with seed, calling visit with each; it stops early
// when visit returns false. It returns the number of schedules run.
func (e *Explorer) Sample(ctx context.Context, cfg Config, seed uint64, n int, visit func(Result) bool) (int, error) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := range n {
		res, err := e.Run(ctx, cfg, func(_ int, enabled []Choice) (int, error) { return rng.IntN(len(enabled)), nil })
		if err != nil {
			return i, fmt.Errorf("%w (schedule %s)", err, res.Schedule)
		}
		if !visit(res) {
			return i + 1, nil
		}
	}
	return n, nil
}
