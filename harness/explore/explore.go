// Package explore is a schedule explorer for the payout pipeline: it runs
// one to three executors on the same payout (or on two payouts of one
// account), and optionally the reconciler, on the real code of every
// service, and decides, one step at a time, which of them moves next,
// when a lease ends behind its holder's back, when the rail loses an
// answer and when a process dies. After each schedule it judges the
// outcome from the rail's journal, raildb and paydb (payoutaudit), never
// from what the workers reported.
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
// lock-server may run as two replicas over the one lock store, as its
// Deployment runs two pods (pipelinetest.Options.LockReplicas, given to
// New): executors A and C talk to the first ("L1"), B and the reconciler
// to the second ("L2"). "L1:restart" or "L2:restart", once per schedule
// after the first grant, restarts that replica between two steps: a new
// Server over a newly opened store serves at its URL, its token floor
// forgotten, and a request held for it reaches the new one.
//
// At a held rail call the explorer may instead lose the rail's answer
// (the rail pays; rail-proxy records the attempt ambiguous) or keep the
// call from the rail (rail-proxy cannot tell the difference). At any other
// held step it may crash the actor: nothing more leaves that process, and
// its lease ends by its TTL.
//
// The reconciler ("R") is one more actor when configured: its read of a
// payout's state, its acquire, its reconciliation at rail-proxy, its
// resolution at payment-resource and its release are held like an
// executor's steps. Its reconciliation needs the attempt to be older than
// rail-proxy's abandon threshold: the explorer offers "age" (every attempt
// of the run becomes that old on raildb's clock) once per schedule, while
// something is in doubt, even while a rail call is still held (a call
// stuck in a network longer than the threshold). A holder may also give
// up on its submission while rail-proxy's call to the rail is held
// ("A:giveup"); that call then becomes rail-proxy's own step ("P:rail"),
// let go whenever the explorer likes, for example after the reconciler
// has found nothing at the rail. rail-proxy's stop order at the rail is
// what keeps such a late call from paying a payout already ended failed.
//
// Three faults model what a holder, or the network, may do beyond the
// executor's own code. "A:forge", taken instead of A's submission once:
// A, whose lease is real, first sends its payout with altered terms
// (another amount or another account under the payout's own signature,
// another payout's signature, a signature over another amount by a key
// that is not payment-resource's), each with its own token and proof, and
// is then back at its genuine submission. "A:resend": a copy of A's last
// submission, same token, proof and terms, reaches rail-proxy again at
// any later point (a client's retry, a duplicated request); its rail
// call, if any, is rail-proxy's step like a given-up one. With "refused"
// this reaches the holder's own resend after a not_sent release and a
// stale holder's resend after a newer holder's release; with "giveup" and
// "age", a release that races an abandonment or a reconciliation.
// "A:reject", taken instead of A's submission: it is refused for good
// before rail-proxy records anything (400 INVALID_REQUEST), A marks the
// payout needs_attention, and the reconciler closes a payout rail-proxy
// never forwarded, after which a late submission must be refused.
//
// A duplicate delivery is one more executor: the schedule decides when
// each one starts acquiring. An acquire is only let go when the key is
// free, so a schedule never waits on the real clock. The executor's
// acquire waits in lock-server's queue of the key while another holds it,
// and is granted right after that release (or expiry): the same grant at
// the same point of the schedule as one let go then, having written
// nothing meanwhile.
//
// An executor answers its push before it releases: Execute returns, then
// the release goes to lock-server from a goroutine of its own. The
// release stays that actor's last held step (StepRelease), and the actor
// is done only once it has been let go or the actor has crashed; the
// explorer may move every other actor, or inject a fault, between the
// actor's last write and its release, as before.
//
// # What is checked after each schedule
//
// After the scheduled actors are done, one more delivery of each payout
// runs to the end unscheduled (Pub/Sub redelivers until a 2xx), time
// passes beyond the abandon threshold and an unscheduled reconciler
// settles what is left in doubt (its next pass), then:
//
//   - every payout is posted, declined or failed (CheckSettled);
//   - INV-04 and INV-05 across the records (payoutaudit.Run on the payouts):
//     at most one rail submission, rail acknowledgements equal to ledger
//     debits, every submission through rail-proxy, the recorded token the
//     one that reached the rail, nothing left unreconciled;
//   - INV-02: the tokens of successive grants strictly increase;
//   - INV-03: rail-proxy forwarded the account's submissions in strictly
//     increasing token order (one equal token only: a holder's own resend
//     of a payout whose forward with it was released not_sent), each
//     payout's fenced writes never went back to a lower token, and no
//     write of a payout of the account carried a token below the
//     account's last debit (the account fence);
//   - revoke takes effect: when the server ended a holder's lease (expire
//     or revoke) before the holder's last lease check preceding its
//     submission, that submission never reached the rail. The last check
//     is the holder's last confirmation with lock-server, or, for an
//     executor that only checks its local deadline, the submission itself;
//   - signed terms (CheckTerms): every forgery refused 403 with raildb
//     unchanged (no attempt, no forward, no high-water mark, for the
//     payout, its account and the forged account), and only paydb's terms
//     in the rail's journal and in raildb's attempts;
//   - recorded outcomes (CheckRecorded): an attempt rail-proxy answered
//     as the payout's forward with an outcome (ambiguous, acked, declined,
//     not_at_rail) is still its forward at the end, its outcome unchanged
//     or, from ambiguous, resolved; and after a reconciliation closed a
//     never-forwarded payout, no submission of it went to the rail.
//
// Each Result also names the rail-proxy outcomes its schedule reached
// (Result.Paths, the Path constants), from rail-proxy's answers as they
// leave it and from raildb: coverage evidence that a test can insist on.
//
// INV-01 and INV-06 are properties of the lock service alone; they are
// checked by lockserver/store/storetest (linearizability) and the SDK's
// simulation, not here.
package explore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	payapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/pipelinetest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/reconciler"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpjson"
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
	// StepAttention: a needs_attention mark reaches payment-resource.
	StepAttention = "attention"
	// The reconciler's own steps (its acquire and release are StepAcquire
	// and StepRelease).
	StepRead      = "read"      // its read of the payout's state reaches payment-resource
	StepReconcile = "reconcile" // its reconciliation reaches rail-proxy
	StepResolve   = "resolve"   // its resolution reaches payment-resource
	stepDone      = "done"
)

// Faults the explorer injects between steps.
const (
	// FaultExpire ends the live lease on the server's clock.
	FaultExpire = "expire"
	// FaultRevoke revokes the live lease, as an operator would.
	FaultRevoke = "revoke"
	// FaultRailLost is taken instead of a holder's StepRail ("A:lost"):
	// the rail pays and its answer to rail-proxy is lost (rail-proxy
	// records the attempt ambiguous).
	FaultRailLost = "lost"
	// FaultRailDown is taken instead of a holder's StepRail ("A:down"):
	// the call never reaches the rail, and rail-proxy cannot tell that from
	// a lost answer (ambiguous too).
	FaultRailDown = "down"
	// FaultRailRefused is taken instead of a holder's StepRail
	// ("A:refused"): the rail refuses the call and says it recorded
	// nothing (rail-stub's 503 RAIL_UNAVAILABLE), which rail-proxy answers
	// RAIL_NOT_REACHED and the executor redelivers. Offered only when a
	// Config's Faults name it.
	FaultRailRefused = "refused"
	// FaultCrash is taken instead of any held step of a holder ("A:crash",
	// never at StepRail, where the call is rail-proxy's): the process dies
	// there. Nothing more leaves it; its lease ends by its TTL.
	FaultCrash = "crash"
	// FaultGiveUp is taken instead of a holder's StepRail ("A:giveup"):
	// the holder's own timeout cuts its call to rail-proxy, while
	// rail-proxy's call to the rail stays held. That call becomes
	// rail-proxy's pending step ("P:rail", or "P:lost", "P:down"), which
	// the explorer lets go whenever it likes, for example after the
	// reconciler has looked the payout up.
	FaultGiveUp = "giveup"
	// FaultAge is not a fault but time passing: every rail attempt of the
	// run becomes older than rail-proxy's abandon threshold, so that the
	// reconciler may reconcile an attempt in doubt. Offered once per
	// schedule, with the reconciler, while an attempt is in doubt, also
	// while a rail call is still held (see the package comment).
	FaultAge = "age"
	// FaultForge is taken instead of a holder's StepSubmit ("A:forge"),
	// once per holder: the holder, whose lease is real, first sends its
	// submission with altered terms (adversary.go: another amount,
	// another account, another payout's signature, a signature that is
	// not payment-resource's), each with its own token and proof; then it
	// is back at StepSubmit with its genuine submission. Each forged
	// submission must be refused 403 with nothing recorded at rail-proxy.
	FaultForge = "forge"
	// FaultResend ("A:resend"): a copy of the holder's last submission,
	// same token, proof and terms, reaches rail-proxy again (the holder's
	// client retried it, or the network duplicated it), at any later
	// point of the schedule, once per holder. Its answer reaches nobody;
	// its rail call, if rail-proxy makes one, is rail-proxy's pending step
	// ("P:rail", "P:refused", ...), as after FaultGiveUp.
	FaultResend = "resend"
	// FaultReject is taken instead of a holder's StepSubmit ("A:reject"):
	// the submission is refused for good before rail-proxy records
	// anything (the explorer answers 400 INVALID_REQUEST in its place,
	// as rail-proxy answers a request no retry can change), so the holder
	// marks the payout needs_attention, and the reconciler closes a
	// payout that was never forwarded.
	FaultReject = "reject"
	// FaultRestart restarts a lock-server replica ("L1:restart",
	// "L2:restart"): its Server is closed and a new one, over a newly
	// opened store on the same lock store, serves at its URL
	// (pipelinetest.Pipeline.RestartLock). It forgets the token floor it
	// kept; the leases and the token counter are the store's. A request
	// held for that replica reaches the new Server. Offered once per
	// schedule, after the first grant, while something else may still
	// happen.
	FaultRestart = "restart"
)

// Bounds of a schedule.
const (
	// MaxHolders is the most executors a schedule runs.
	MaxHolders = 3
	// Reconciler names the reconciler in a schedule ("R:read").
	Reconciler = "R"
	// reconcilerIndex is the reconciler's holder index.
	reconcilerIndex = MaxHolders
	// RailProxy names rail-proxy in a schedule ("P:rail"): it moves only
	// a rail call whose caller gave up (FaultGiveUp).
	RailProxy = "P"
	// railProxyIndex is rail-proxy's holder index.
	railProxyIndex = MaxHolders + 1
	// LockReplica names lock-server replica i (from 1) in a schedule
	// ("L2:restart"), with the replica's number after it.
	LockReplica = "L"
	// headerHolder tells the explorer's handler in front of rail-proxy
	// which actor sent a submission.
	headerHolder = "X-Explore-Holder"
	// ttl is every lease's TTL: longer than any schedule, so that only the
	// explorer's faults end a lease, and no background renewal runs.
	ttl = 10 * time.Minute
)

// Choice is one decision of a schedule: let a holder's step go, or inject
// a fault.
type Choice struct {
	// Holder is the executor moved ("A", "B", "C"), or the process the
	// step or fault is of ("R", "P", a lock-server replica "L1"), "" for
	// a fault on the lock.
	Holder string
	// Step is the step it takes (a Step constant), or the fault (a Fault
	// constant).
	Step string
}

// String is "A:claim" for a step (or a holder's fault, "A:crash"), the
// fault's name for a fault on the lock.
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
		case !ok && (f == FaultExpire || f == FaultRevoke || f == FaultAge):
			s = append(s, Choice{Step: f})
		case ok && (len(h) == 1 && h[0] >= 'A' && h[0] < 'A'+MaxHolders || h == Reconciler || h == RailProxy ||
			step == FaultRestart && replicaIndex(h) >= 0):
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
	// Payouts is how many payouts of one account the executors work on,
	// 1 (the default, for 0) or 2: executor i delivers payout i mod
	// Payouts. With two, the payouts share the account's lock and its
	// account fence, and a stale holder of one meets the fence raised by
	// a holder of the other.
	Payouts int
	// Reconciler adds the reconciler ("R") as one more scheduled actor:
	// it reads each payout's state and settles the ones in doubt (the
	// reconciler package's Settle), under the payout's lease.
	Reconciler bool
	// MaxFaults is how many faults a schedule may inject.
	MaxFaults int
	// Faults are the kinds injected (FaultExpire, FaultRevoke,
	// FaultRailLost, FaultRailDown, FaultRailRefused, FaultCrash,
	// FaultGiveUp, FaultForge, FaultResend, FaultReject, FaultRestart).
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
	// Ended is each payout's state after the last delivery and the
	// reconciler, in the order of the run's payouts (payment-resource's
	// api.State values).
	Ended []string
	// Paths names the rail-proxy outcomes the schedule reached (Path
	// constants, sorted, each once), judged from rail-proxy's answers and
	// raildb: coverage evidence, not a check.
	Paths []string
	// RestartedGrants counts the grants a scheduled actor got from a
	// lock-server replica after FaultRestart restarted it: coverage
	// evidence, not a check.
	RestartedGrants int
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
	// CheckSettled: after the last delivery and the reconciler, a payout
	// is not posted, declined or failed: it would wait for a person
	// although the rail's record could settle it.
	CheckSettled = "settled"
	// CheckTerms: a forged submission (FaultForge) was not refused 403,
	// or changed raildb (an attempt or a high-water mark recorded), or
	// terms other than paydb's reached the rail's journal or raildb's
	// attempts.
	CheckTerms = "terms"
	// CheckRecorded: an attempt rail-proxy answered as the payout's
	// forward with an outcome (ambiguous, acked, declined, not_at_rail)
	// was later released or went back (a not_sent release that raced an
	// abandonment or a reconciliation), or a submission of a payout the
	// reconciler had closed went on to the rail.
	CheckRecorded = "recorded-outcome"
)

// Explorer runs schedules against one pipeline. Each schedule has its own
// payout and account, so schedules never see each other's records.
type Explorer struct {
	p    *pipelinetest.Pipeline
	log  *slog.Logger
	seq  atomic.Int64
	runs sync.Map // payout id -> *run, for the rail hook
	// decoy is another account's payout whose signature a forgery borrows
	// (FaultForge).
	decoy decoy
}

// New starts a pipeline (pipelinetest.Start with opts, its RailHandler
// and ProxyHandler replaced by the explorer's), creates the decoy payout
// whose signature FaultForge borrows (payout decoy-1 of acct-decoy), and
// returns an Explorer over it.
func New(t testing.TB, opts pipelinetest.Options) *Explorer {
	t.Helper()
	e := &Explorer{log: opts.Log}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	opts.RailHandler, opts.ProxyHandler = e.holdRail, e.watchProxy
	e.p = pipelinetest.Start(t, opts)
	d, err := e.newDecoy(context.Background())
	if err != nil {
		t.Fatalf("explore: the decoy payout: %v", err)
	}
	e.decoy = d
	return e
}

// arrival is an actor (executor or reconciler) stopped at a step, or done.
type arrival struct {
	holder int
	step   string
	resume chan string // receives the choice's step (or FaultRailLost, FaultRailDown, FaultCrash); nil when done
	err    error       // when done
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
	events  []payoutevent.Event // the payouts, all of one account
	arrive  chan arrival
	running atomic.Int32 // the holder let go last; -1 when unscheduled

	// detached is the holder whose rail call rail-proxy still holds after
	// the holder gave up on it (-1: none); proxyDone receives when
	// rail-proxy's handling of that call has ended.
	detached  atomic.Int32
	proxyDone chan struct{}
	doers     map[int]*doer
	// ended is closed when Run returns: whatever is still held then
	// (after an error of the explorer's own) is let go, the rail's calls
	// as if the rail were down, so that no server waits forever.
	ended chan struct{}

	mu     sync.Mutex
	grants []int64 // tokens granted, in order
	tokens map[int]int64
	// restarted is the lock-server replica FaultRestart restarted (-1:
	// none); restartedGrants counts the grants it made since.
	restarted       int
	restartedGrants int

	// forging is set while a holder's forged submissions are sent: a
	// rail call they cause (with the terms check broken) is not held.
	forging atomic.Bool
	// detachedResend tells watchProxy that the detached call is a resend
	// (FaultResend), not a call its caller gave up on.
	detachedResend atomic.Bool
	// bg counts the resends still waiting for their answer.
	bg sync.WaitGroup
	// seen is what rail-proxy answered and what the forgeries did
	// (adversary.go).
	seen seen
}

// errCrashed is what a crashed actor's transport answers: nothing leaves
// a dead process.
var errCrashed = errors.New("explore: the process crashed")

// holdRail wraps the rail: a call for a payout under exploration stops
// until the explorer lets it go, as a step of the holder that is running.
// The explorer's choice decides what the rail does with it: answer
// (StepRail), pay and lose the answer (FaultRailLost), or never see it
// (FaultRailDown).
func (e *Explorer) holdRail(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		payout, err := payoutOf(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mode := StepRail
		if v, ok := e.runs.Load(payout); ok {
			run := v.(*run)
			if h := int(run.running.Load()); h >= 0 && !run.forging.Load() {
				mode = run.hold(arrival{holder: h, step: StepRail, resume: make(chan string)}, FaultRailDown)
			}
		}
		switch mode {
		case FaultRailDown:
			http.Error(w, "the rail is down", http.StatusServiceUnavailable)
		case FaultRailRefused:
			httpjson.WriteError(w, http.StatusServiceUnavailable, rail.CodeUnavailable, "the rail recorded nothing", true)
		case FaultRailLost:
			next.ServeHTTP(httptest.NewRecorder(), r)
			http.Error(w, "the rail's answer was lost", http.StatusBadGateway)
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// payoutOf reads the payoutId of r's JSON body ("" when it has none) and
// puts the body back for the handler behind.
func payoutOf(r *http.Request) (string, error) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return "", err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	var req struct {
		PayoutID string `json:"payoutId"`
	}
	_ = json.Unmarshal(body, &req)
	return req.PayoutID, nil
}

// hold reports a at its step and waits for the explorer's choice; once the
// run has ended, the answer is orElse.
func (r *run) hold(a arrival, orElse string) string {
	select {
	case r.arrive <- a:
	case <-r.ended:
		return orElse
	}
	select {
	case mode := <-a.resume:
		return mode
	case <-r.ended:
		return orElse
	}
}

// watchProxy wraps rail-proxy: when its handling of a submission whose
// caller gave up ends (the rail's answer, or its absence, recorded), the
// explorer hears of it, so that the next choice sees that record.
func (e *Explorer) watchProxy(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != railapi.PathSubmissions && r.URL.Path != railapi.PathReconciliations {
			next.ServeHTTP(w, r)
			return
		}
		payout, err := payoutOf(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		v, ok := e.runs.Load(payout)
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		run := v.(*run)
		if r.URL.Path == railapi.PathReconciliations {
			run.watchReconciliation(next, w, r, payout)
			return
		}
		c := &capture{ResponseWriter: w}
		next.ServeHTTP(c, r)
		run.seen.submission(r, payout, c)
		resend := r.Header.Get(headerResend) != ""
		if h := run.detached.Load(); h >= 0 && holderName(int(h)) == r.Header.Get(headerHolder) && resend == run.detachedResend.Load() {
			run.detached.Store(-1)
			run.detachedResend.Store(false)
			select {
			case run.proxyDone <- struct{}{}:
			case <-run.ended:
			}
		}
	})
}

// doer is one actor's transport: it holds each deciding request until
// the explorer lets it go.
type doer struct {
	r       *run
	holder  int // -1: never held
	crashed atomic.Bool

	mu  sync.Mutex
	cut context.CancelFunc // cancels the request in flight

	// last is the holder's last submission as sent (FaultResend sends it
	// again); forged and resent: FaultForge and FaultResend were taken.
	last           *sentRequest
	forged, resent bool
}

// giveUp cuts the request in flight, as the caller's own timeout would.
func (d *doer) giveUp() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cut != nil {
		d.cut()
	}
}

// stepOf names the step req takes, "" for a request that is never held.
// The reads an executor starts with decide nothing (the facts they read
// never change); the reconciler's read of a payout's state decides
// whether it acts, so it is a step of its own.
func (r *run) stepOf(req *http.Request, reconciler bool) string {
	p := req.URL.Path
	if req.Method == http.MethodGet {
		switch {
		case p == railapi.PathAttempts:
			return StepLookup
		case reconciler && r.isPayoutPath(p, payapi.PayoutPath):
			return StepRead
		}
		return ""
	}
	switch {
	case strings.HasPrefix(p, api.PathLockPrefix) && strings.HasSuffix(p, api.SuffixAcquire):
		return StepAcquire
	case strings.HasPrefix(p, api.PathLockPrefix) && strings.HasSuffix(p, api.SuffixRenew):
		return StepConfirm
	case strings.HasPrefix(p, api.PathLockPrefix) && strings.HasSuffix(p, api.SuffixRelease):
		return StepRelease
	case r.isPayoutPath(p, payapi.ClaimPath):
		return StepClaim
	case r.isPayoutPath(p, payapi.ResultPath):
		return StepReport
	case r.isPayoutPath(p, payapi.AttentionPath):
		return StepAttention
	case r.isPayoutPath(p, payapi.ResolutionPath):
		return StepResolve
	case p == railapi.PathSubmissions:
		return StepSubmit
	case p == railapi.PathReconciliations:
		return StepReconcile
	}
	return ""
}

// isPayoutPath reports whether p is path(id) for one of the run's payouts.
func (r *run) isPayoutPath(p string, path func(id string) string) bool {
	for _, ev := range r.events {
		if p == path(ev.PayoutID) {
			return true
		}
	}
	return false
}

func (d *doer) Do(req *http.Request) (*http.Response, error) {
	if d.crashed.Load() {
		return nil, errCrashed
	}
	step := d.r.stepOf(req, d.holder == reconcilerIndex)
	if d.holder >= 0 {
		req.Header.Set(headerHolder, holderName(d.holder))
	}
	for d.holder >= 0 && step != "" {
		mode := d.r.hold(arrival{holder: d.holder, step: step, resume: make(chan string)}, FaultCrash)
		if mode == FaultCrash {
			d.crashed.Store(true)
			return nil, errCrashed
		}
		if mode == FaultReject {
			return rejected(), nil
		}
		if mode != FaultForge {
			break
		}
		// The forgeries go first; then the holder is back at its step.
		if err := d.r.forge(req); err != nil {
			return nil, err
		}
	}
	if step == StepSubmit && d.holder >= 0 {
		sent, err := keep(req)
		if err != nil {
			return nil, err
		}
		d.mu.Lock()
		d.last = sent
		d.mu.Unlock()
	}
	ctx, cut := context.WithCancel(req.Context())
	d.mu.Lock()
	d.cut = cut
	d.mu.Unlock()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	d.mu.Lock()
	d.cut = nil
	d.mu.Unlock()
	if err != nil {
		cut()
		return nil, err
	}
	if step != StepAcquire || resp.StatusCode != http.StatusOK {
		return resp, nil
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
			if d.r.restarted == d.r.replicaOf(d.holder) {
				d.r.restartedGrants++
			}
		}
		d.r.mu.Unlock()
	}
	return resp, nil
}

// Chooser picks one of enabled (never empty) at a decision; depth counts
// the decisions made before it in the schedule.
type Chooser func(depth int, enabled []Choice) (int, error)

func holderName(h int) string {
	switch h {
	case reconcilerIndex:
		return Reconciler
	case railProxyIndex:
		return RailProxy
	}
	return string(rune('A' + h))
}

// replicaName names lock-server replica i (from 0) in a schedule.
func replicaName(i int) string { return fmt.Sprintf("%s%d", LockReplica, i+1) }

// replicaIndex is the replica name names (from 0), or -1.
func replicaIndex(name string) int {
	if len(name) == 2 && name[0] == LockReplica[0] && name[1] >= '1' && name[1] <= '9' {
		return int(name[1] - '1')
	}
	return -1
}

// replicaOf is the lock-server replica holder h talks to: executor i the
// replica i mod the number of replicas, the reconciler the next after the
// executors' first (the second of two), an unscheduled actor (-1) the
// first.
func (r *run) replicaOf(h int) int {
	if h < 0 {
		return 0
	}
	return h % len(r.e.p.LockURLs)
}

func holderIndex(name string) int {
	switch name {
	case Reconciler:
		return reconcilerIndex
	case RailProxy:
		return railProxyIndex
	}
	return int(name[0] - 'A')
}

func (r *run) executor(owner string, d *doer) (*executor.Executor, error) {
	cfg := executor.DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL = r.e.p.LockURLs[r.replicaOf(d.holder)], r.e.p.PayURL, r.e.p.ProxyURL
	cfg.Owner, cfg.LeaseTTL = owner, ttl
	cfg.AcquireWait, cfg.RequestTimeout, cfg.RailTimeout = 5*time.Minute, 5*time.Minute, 5*time.Minute
	// Only a crashed process's calls fail in a schedule: its retries need
	// not wait on the real clock.
	cfg.ReportRetry.Initial, cfg.ReportRetry.Max = time.Millisecond, time.Millisecond
	return executor.New(cfg, r.e.log.With("service", "executor", "worker", owner), executor.WithHTTPClient(d))
}

func (r *run) reconciler(owner string, d *doer) (*reconciler.Reconciler, error) {
	cfg := reconciler.DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL = r.e.p.LockURLs[r.replicaOf(d.holder)], r.e.p.PayURL, r.e.p.ProxyURL
	cfg.Owner, cfg.LeaseTTL = owner, ttl
	cfg.AcquireWait, cfg.RequestTimeout = 5*time.Minute, 5*time.Minute
	return reconciler.New(cfg, r.e.log.With("service", "reconciler", "worker", owner), reconciler.WithHTTPClient(d))
}

// settleAll runs the reconciler x over every payout of the run, in order.
func (r *run) settleAll(ctx context.Context, x *reconciler.Reconciler) ([]reconciler.Result, error) {
	var out []reconciler.Result
	for _, ev := range r.events {
		res, err := x.Settle(ctx, ev.PayoutID)
		if err != nil {
			return out, err
		}
		out = append(out, res)
	}
	return out, nil
}

// inDoubt reports whether a rail attempt of the run's account is
// forwarding or ambiguous.
func (r *run) inDoubt(ctx context.Context) (bool, error) {
	var n int
	err := r.e.p.RailDB.QueryRow(ctx, `SELECT count(*) FROM rail_attempt WHERE account_id = $1 AND state = ANY($2)`,
		r.events[0].AccountID, []string{string(railapi.StateForwarding), string(railapi.StateAmbiguous)}).Scan(&n)
	return n > 0, err
}

// age makes every rail attempt of the run's account older than
// rail-proxy's abandon threshold, on raildb's clock.
func (r *run) age(ctx context.Context) error {
	_, err := r.e.p.RailDB.Exec(ctx, `UPDATE rail_attempt SET created_at = created_at - interval '1 day' WHERE account_id = $1`, r.events[0].AccountID)
	return err
}

// Run runs one schedule of cfg, asking choose at each decision, and checks
// its outcome. The error is the explorer's own (a service that failed, a
// nondeterministic replay), never a broken check.
func (e *Explorer) Run(ctx context.Context, cfg Config, choose Chooser) (Result, error) {
	if cfg.Holders < 1 || cfg.Holders > MaxHolders {
		return Result{}, fmt.Errorf("explore: %d holders; want 1..%d", cfg.Holders, MaxHolders)
	}
	if cfg.Payouts == 0 {
		cfg.Payouts = 1
	}
	if cfg.Payouts < 1 || cfg.Payouts > 2 {
		return Result{}, fmt.Errorf("explore: %d payouts; want 1 or 2", cfg.Payouts)
	}
	n := e.seq.Add(1)
	r := &run{e: e, arrive: make(chan arrival), tokens: map[int]int64{}, proxyDone: make(chan struct{}, 1), doers: map[int]*doer{},
		ended: make(chan struct{})}
	r.detached.Store(-1)
	r.restarted = -1
	defer close(r.ended)
	for i := range cfg.Payouts {
		id := fmt.Sprintf("p-%d", n)
		if i > 0 {
			id = fmt.Sprintf("p-%d-%d", n, i+1)
		}
		r.events = append(r.events, payoutevent.Event{PayoutID: id, AccountID: fmt.Sprintf("acct-%d", n), AmountMinor: 2500 + int64(i)*100, Currency: "EUR"})
	}
	r.running.Store(-1)
	for _, ev := range r.events {
		if err := e.p.CreatePayout(ctx, ev); err != nil {
			return Result{}, err
		}
		e.runs.Store(ev.PayoutID, r)
		defer e.runs.Delete(ev.PayoutID)
	}

	// Each actor runs on a context of its own: a crash cancels it, so
	// that the dead process's loops (the SDK's acquire retries) end at
	// once. Whatever happens, no actor outlives the run.
	runCtx, endRun := context.WithCancel(ctx)
	defer endRun()
	kill := map[int]context.CancelFunc{}
	done := func(h int, err error) {
		select {
		case r.arrive <- arrival{holder: h, step: stepDone, err: err}:
		case <-runCtx.Done():
		}
	}
	actors := make([]int, 0, cfg.Holders+1)
	for h := range cfg.Holders {
		actors = append(actors, h)
		r.doers[h] = &doer{r: r, holder: h}
		x, err := r.executor(holderName(h), r.doers[h])
		if err != nil {
			return Result{}, err
		}
		ev := r.events[h%len(r.events)]
		actx, cancel := context.WithCancel(runCtx)
		kill[h] = cancel
		go func() {
			_, err := x.Execute(actx, ev)
			// Execute has answered; its release goes to lock-server after
			// that, from a goroutine of its own, as this actor's next held
			// step (StepRelease). Waiting for it here keeps one step of
			// this actor in flight at a time, and the actor done only
			// once its release has been let go (or it crashed).
			_ = x.Close(context.WithoutCancel(actx))
			done(h, err)
		}()
	}
	if cfg.Reconciler {
		actors = append(actors, reconcilerIndex)
		d := &doer{r: r, holder: reconcilerIndex}
		x, err := r.reconciler(Reconciler, d)
		if err != nil {
			return Result{}, err
		}
		actx, cancel := context.WithCancel(runCtx)
		kill[reconcilerIndex] = cancel
		go func() {
			_, err := r.settleAll(actx, x)
			if d.crashed.Load() {
				err = nil // its read failed because it died
			}
			done(reconcilerIndex, err)
		}()
	}
	pending := map[int]arrival{}
	for len(pending) < len(actors) {
		a := <-r.arrive
		pending[a.holder] = a
	}
	var (
		res       Result
		steps     []stepRecord
		ended     []endedLease
		faults    int
		aged      bool
		restarted bool
		// proxyCall is a rail call rail-proxy still holds after its
		// caller gave up on it; nil when there is none.
		proxyCall *arrival
	)
	key := r.events[0].LockKey()
	for {
		state, err := e.p.Locks.Inspect(ctx, key)
		if err != nil {
			return res, err
		}
		live := state.Lease != nil
		var enabled []Choice
		waiting := false
		for _, h := range actors {
			a := pending[h]
			if h == reconcilerIndex && a.err != nil {
				return res, fmt.Errorf("explore: the reconciler: %w", a.err) // a read that failed
			}
			switch {
			case a.step == stepDone:
			case a.step == StepAcquire && live:
				waiting = true
			default:
				enabled = append(enabled, Choice{Holder: holderName(h), Step: a.step})
				if faults < cfg.MaxFaults {
					if a.step == StepRail {
						for _, f := range []string{FaultRailLost, FaultRailDown, FaultRailRefused, FaultGiveUp} {
							if slices.Contains(cfg.Faults, f) && (f != FaultGiveUp || proxyCall == nil) {
								enabled = append(enabled, Choice{Holder: holderName(h), Step: f})
							}
						}
					} else {
						if a.step == StepSubmit && h != reconcilerIndex {
							for _, f := range []string{FaultForge, FaultReject} {
								if slices.Contains(cfg.Faults, f) && (f != FaultForge || !r.doers[h].forged) {
									enabled = append(enabled, Choice{Holder: holderName(h), Step: f})
								}
							}
						}
						if slices.Contains(cfg.Faults, FaultCrash) {
							enabled = append(enabled, Choice{Holder: holderName(h), Step: FaultCrash})
						}
					}
				}
			}
		}
		if proxyCall != nil {
			enabled = append(enabled, Choice{Holder: RailProxy, Step: StepRail})
			for _, f := range []string{FaultRailLost, FaultRailDown, FaultRailRefused} {
				if faults < cfg.MaxFaults && slices.Contains(cfg.Faults, f) {
					enabled = append(enabled, Choice{Holder: RailProxy, Step: f})
				}
			}
		}
		if live && faults < cfg.MaxFaults {
			for _, f := range cfg.Faults {
				if f == FaultExpire || f == FaultRevoke {
					enabled = append(enabled, Choice{Step: f})
				}
			}
		}
		if cfg.Reconciler && !aged && pending[reconcilerIndex].step != stepDone {
			doubt, err := r.inDoubt(ctx)
			if err != nil {
				return res, err
			}
			if doubt {
				enabled = append(enabled, Choice{Step: FaultAge})
			}
		}
		// A resend is offered while something else may still happen (it
		// never is the only choice, or every schedule would end with one).
		if len(enabled) > 0 && proxyCall == nil && faults < cfg.MaxFaults && slices.Contains(cfg.Faults, FaultResend) {
			for _, h := range actors {
				if d := r.doers[h]; h != reconcilerIndex && d.sent() && !d.resent {
					enabled = append(enabled, Choice{Holder: holderName(h), Step: FaultResend})
				}
			}
		}
		// So is a restart, once there is a token floor to forget.
		if len(enabled) > 0 && !restarted && faults < cfg.MaxFaults && slices.Contains(cfg.Faults, FaultRestart) && r.granted() {
			for i := range e.p.LockURLs {
				enabled = append(enabled, Choice{Holder: replicaName(i), Step: FaultRestart})
			}
		}
		if len(enabled) == 0 {
			if !waiting {
				break
			}
			// Everyone left waits for a lease whose holder is done (its
			// release failed, or it crashed): it ends by its TTL. Not a
			// fault.
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
			var tok int64
			switch c.Step {
			case FaultAge:
				aged = true
				if err := r.age(ctx); err != nil {
					return res, err
				}
				continue
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
			faults++
			ended = append(ended, endedLease{index: len(res.Schedule) - 1, token: tok})
			continue
		}
		if c.Step == FaultRestart {
			// Nothing is in flight at lock-server between two choices.
			restarted = true
			faults++
			i := replicaIndex(c.Holder)
			if err := e.p.RestartLock(i); err != nil {
				return res, fmt.Errorf("explore: restart %s: %w", c.Holder, err)
			}
			r.mu.Lock()
			r.restarted = i
			r.mu.Unlock()
			continue
		}
		h := holderIndex(c.Holder)
		switch c.Step {
		case FaultCrash, FaultRailLost, FaultRailDown, FaultRailRefused, FaultGiveUp, FaultForge, FaultResend, FaultReject:
			faults++
		}
		steps = append(steps, stepRecord{index: len(res.Schedule) - 1, holder: h, step: c.Step})
		if h == railProxyIndex {
			// The call its caller gave up on goes on; rail-proxy records
			// what came of it before the next choice.
			if err := r.letProxyGo(ctx, proxyCall, c.Step); err != nil {
				return res, err
			}
			proxyCall = nil
			continue
		}
		if c.Step == FaultResend {
			// A copy of h's submission reaches rail-proxy; h stays where
			// it is. A rail call it causes is rail-proxy's pending step.
			r.doers[h].resent = true
			call, err := r.resend(ctx, runCtx, h)
			if err != nil {
				return res, err
			}
			proxyCall = call
			continue
		}
		if c.Step == FaultForge {
			r.doers[h].forged = true
		}
		r.running.Store(int32(h))
		if c.Step == FaultGiveUp {
			// The rail call stays held, now as rail-proxy's; the holder's
			// own call is cut and it goes on from there.
			proxyCall = &arrival{holder: railProxyIndex, step: StepRail, resume: pending[h].resume}
			r.detached.Store(int32(h))
			r.doers[h].giveUp()
		} else {
			select {
			case pending[h].resume <- c.Step:
			case <-ctx.Done():
				return res, ctx.Err()
			}
		}
		if c.Step == FaultCrash {
			kill[h]()
		}
		// The actor runs until its next held step, or to its end (a
		// crashed one fails every call from now on without arriving).
		select {
		case a := <-r.arrive:
			if a.holder != h {
				return res, fmt.Errorf("explore: %s arrived while %s was running", holderName(a.holder), c.Holder)
			}
			if c.Step == FaultCrash && a.step != stepDone {
				return res, fmt.Errorf("explore: %s crashed, yet arrived at %s", c.Holder, a.step)
			}
			pending[h] = a
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}
	r.running.Store(-1)
	if proxyCall != nil {
		if err := r.letProxyGo(ctx, proxyCall, StepRail); err != nil {
			return res, err
		}
	}
	if err := r.finish(ctx); err != nil {
		return res, err
	}
	r.bg.Wait()
	r.mu.Lock()
	res.RestartedGrants = r.restartedGrants
	r.mu.Unlock()
	return res, r.check(ctx, &res, steps, ended)
}

// granted reports whether lock-server has granted anything in the run.
func (r *run) granted() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.grants) > 0
}

// letProxyGo lets rail-proxy's held rail call a go with the rail's
// answer mode (StepRail, FaultRailLost, FaultRailDown), and waits until
// rail-proxy has handled the outcome.
func (r *run) letProxyGo(ctx context.Context, a *arrival, mode string) error {
	select {
	case a.resume <- mode:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-r.proxyDone:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// endedLease is a fault: the lease carrying token ended on the server at
// schedule position index.
type endedLease struct {
	index int
	token int64
}

// finish lets Pub/Sub redeliver each payout's event to one more,
// unscheduled, executor until an answer would be acknowledged; then time
// passes beyond rail-proxy's abandon threshold and an unscheduled
// reconciler settles what is left in doubt, as its next scheduled pass
// would.
func (r *run) finish(ctx context.Context) error {
	if s, err := r.e.p.Locks.Inspect(ctx, r.events[0].LockKey()); err != nil {
		return err
	} else if s.Lease != nil {
		r.e.p.LockClock.Advance(ttl + time.Millisecond)
	}
	x, err := r.executor("Z", &doer{r: r, holder: -1})
	if err != nil {
		return err
	}
	for _, ev := range r.events {
		var (
			err2 error
			done bool
		)
		for range 3 {
			out, err := x.Execute(ctx, ev)
			if executor.Status(out, err) == http.StatusOK {
				done = true
				break
			}
			err2 = err
		}
		if !done {
			return fmt.Errorf("explore: the last delivery of %s never ended: %w", ev.PayoutID, err2)
		}
	}
	// Its last release, before the reconciler asks for the lock.
	if err := x.Close(ctx); err != nil {
		return err
	}
	if err := r.age(ctx); err != nil {
		return err
	}
	y, err := r.reconciler("Y", &doer{r: r, holder: -1})
	if err != nil {
		return err
	}
	_, err = r.settleAll(ctx, y)
	return err
}

// check fills res.Violations from the records.
func (r *run) check(ctx context.Context, res *Result, steps []stepRecord, ended []endedLease) error {
	res.Violations = []string{}
	broken := map[string]bool{}
	fail := func(check, format string, args ...any) {
		broken[check] = true
		res.Violations = append(res.Violations, check+": "+fmt.Sprintf(format, args...))
	}
	ids := make([]string, len(r.events))
	for i, ev := range r.events {
		ids[i] = ev.PayoutID
	}
	rep, err := r.e.p.Audit(ctx, ids...)
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
	// The one equal token allowed: the holder's own resend of a payout
	// whose forward with that token was released not_sent.
	rows, err := r.e.p.RailDB.Query(ctx, `SELECT payout_id, token, state FROM rail_attempt WHERE account_id = $1 ORDER BY attempt_id`, r.events[0].AccountID)
	if err != nil {
		return err
	}
	var (
		last                int64
		lastPayout, lastSet string
		forwarded           = map[int64]bool{}
	)
	for rows.Next() {
		var tok int64
		var payout, state string
		if err := rows.Scan(&payout, &tok, &state); err != nil {
			rows.Close()
			return err
		}
		if s := railapi.State(state); s == railapi.StateFenced || s == railapi.StateDuplicate {
			continue
		}
		forwarded[tok] = true
		if tok < last || tok == last && (payout != lastPayout || railapi.State(lastSet) != railapi.StateNotSent) {
			fail(CheckFences, "rail-proxy forwarded token %d after %d", tok, last)
		}
		last, lastPayout, lastSet = tok, payout, state
	}
	if err := rows.Err(); err != nil {
		return err
	}
	// Fence point one: each payout's fenced writes never go back, and no
	// write of any payout of the account carries a token below the
	// account's last debit (the account fence).
	for _, ev := range r.events {
		if err := r.checkPayout(ctx, res, ev.PayoutID, fail); err != nil {
			return err
		}
	}
	rows, err = r.e.p.PayDB.Query(ctx, `SELECT payout_id, to_state, token FROM payout_transition
WHERE payout_id = ANY($1) AND token IS NOT NULL ORDER BY transition_id`, ids)
	if err != nil {
		return err
	}
	var debit int64
	for rows.Next() {
		var (
			id, to string
			tok    int64
		)
		if err := rows.Scan(&id, &to, &tok); err != nil {
			rows.Close()
			return err
		}
		if tok < debit {
			fail(CheckFences, "payment-resource accepted a write of %s (to %s) with token %d after the account's debit with token %d", id, to, tok, debit)
		}
		if payapi.State(to) == payapi.StatePosted {
			debit = max(debit, tok)
		}
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
	if err := r.checkAdversary(ctx, res, fail); err != nil {
		return err
	}
	for c := range broken {
		res.Checks = append(res.Checks, c)
	}
	slices.Sort(res.Checks)
	return nil
}

// checkPayout checks that the payout's fenced writes never went back to a
// lower token and that it ended settled (CheckFences, CheckSettled).
func (r *run) checkPayout(ctx context.Context, res *Result, id string, fail func(check, format string, args ...any)) error {
	rows, err := r.e.p.PayDB.Query(ctx, `SELECT token FROM payout_transition WHERE payout_id = $1 AND token IS NOT NULL ORDER BY transition_id`, id)
	if err != nil {
		return err
	}
	var last int64
	for rows.Next() {
		var tok int64
		if err := rows.Scan(&tok); err != nil {
			rows.Close()
			return err
		}
		if tok < last {
			fail(CheckFences, "payment-resource accepted a write of %s with token %d after %d", id, tok, last)
		}
		last = tok
	}
	if err := rows.Err(); err != nil {
		return err
	}
	p, err := r.e.p.Pay.Payout(ctx, id)
	if err != nil {
		return err
	}
	res.Ended = append(res.Ended, string(p.State))
	switch p.State {
	case payapi.StatePosted, payapi.StateDeclined, payapi.StateFailed:
	default:
		fail(CheckSettled, "%s left %s after the last delivery and the reconciler", id, p.State)
	}
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

// Sample runs n schedules of cfg, each choice drawn at random by a
// generator seeded with seed, calling visit with each; it stops early
// when visit returns false. It returns the number of schedules run.
//
// The draw is weighted (weight), not uniform: a crash is enabled at
// nearly every step of every actor, and a uniform draw would spend the
// fault budget on crashes before any submission reached the rail, and
// move the reconciler before anything is in doubt. Exhaustive covers
// every choice alike.
func (e *Explorer) Sample(ctx context.Context, cfg Config, seed uint64, n int, visit func(Result) bool) (int, error) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := range n {
		res, err := e.Run(ctx, cfg, func(_ int, enabled []Choice) (int, error) {
			total := 0.0
			for _, c := range enabled {
				total += weight(c)
			}
			x := rng.Float64() * total
			for i, c := range enabled {
				if x -= weight(c); x < 0 {
					return i, nil
				}
			}
			return len(enabled) - 1, nil
		})
		if err != nil {
			return i, fmt.Errorf("%w (schedule %s)", err, res.Schedule)
		}
		if !visit(res) {
			return i + 1, nil
		}
	}
	return n, nil
}

// weight is a choice's weight in Sample's draw: a step 1, the rail's
// faults 1 each (they only compete with one step), a crash 0.05, the
// faults on the lease 0.3, the reconciler's read 0.05 and its other
// steps 0.2 (so that it tends to read once something is in doubt),
// rail-proxy's call whose
// caller gave up 0.05 (so that it tends to arrive late, after the others
// have moved on), time passing 1, a forgery 0.3, a resend or a refusal
// for good 0.15 (a resend is offered at nearly every decision), a
// lock-server restart 0.15 (so is it).
func weight(c Choice) float64 {
	switch {
	case c.Step == FaultRestart:
		return 0.15
	case c.Step == FaultResend, c.Step == FaultReject:
		return 0.15
	case c.Step == FaultForge:
		return 0.3
	case c.Step == FaultCrash, c.Holder == RailProxy, c.Holder == Reconciler && c.Step == StepRead:
		return 0.05
	case c.Holder == "" && c.Step != FaultAge:
		return 0.3
	case c.Holder == Reconciler:
		return 0.2
	}
	return 1
}
