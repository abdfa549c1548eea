package explore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"

	payapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
)

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
			jsonhandler.WriteError(w, http.StatusServiceUnavailable, rail.CodeUnavailable, "the rail recorded nothing", true)
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
// An executor reads nothing before its writes (its claim carries the
// event's terms, which payment-resource compares with the payout); the
// reconciler's read of a payout's state decides whether it acts, so it
// is a step of its own.
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

// answer is one answer of rail-proxy to a submission or a
// reconciliation of a payout of the run, in the order they ended.
type answer struct {
	reconciliation bool
	payout         string
	resend, forged bool
	status         int
	code           railapi.Code
	// attempt is the payout's forward the answer carries (a
	// PAYOUT_ALREADY_SUBMITTED refusal, a reconciliation), nil otherwise.
	attempt *railapi.Attempt
	// resolved: a reconciliation that recorded the outcome; closed: a
	// reconciliation of a payout that had no forward before it.
	resolved, closed bool
}

// seen collects a run's answers and the forgeries' verdicts.
type seen struct {
	mu      sync.Mutex
	answers []answer
	// forgery lists, per forged submission, what was wrong with its
	// handling ("" when it was refused 403 with nothing recorded).
	forgery []string
}

// capture records the status and body of an answer on its way out.
type capture struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (c *capture) WriteHeader(status int) {
	if c.status == 0 {
		c.status = status
	}
	c.ResponseWriter.WriteHeader(status)
}

func (c *capture) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	c.body.Write(b)
	return c.ResponseWriter.Write(b)
}

// decode reads c's answer: its code (an error envelope's) and the
// attempt it carries, if any.
func (c *capture) decode(reconciliation bool) (railapi.Code, *railapi.Attempt, bool) {
	if reconciliation && c.status == http.StatusOK {
		var rec railapi.Reconciliation
		if json.Unmarshal(c.body.Bytes(), &rec) != nil {
			return "", nil, false
		}
		return "", &rec.Attempt, rec.Resolved
	}
	var ans railapi.AlreadySubmittedAnswer
	if json.Unmarshal(c.body.Bytes(), &ans) != nil {
		return "", nil, false
	}
	if ans.Error.Code == railapi.CodeAlreadySubmitted {
		return ans.Error.Code, &ans.Attempt, false
	}
	return ans.Error.Code, nil, false
}

// submission records rail-proxy's answer c to the submission r.
func (s *seen) submission(r *http.Request, payout string, c *capture) {
	code, attempt, _ := c.decode(false)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answers = append(s.answers, answer{payout: payout, resend: r.Header.Get(headerResend) != "", forged: r.Header.Get(headerForged) != "",
		status: c.status, code: code, attempt: attempt})
}

// watchReconciliation serves a reconciliation of payout and records its
// answer, noting whether the payout had a forward before it.
func (r *run) watchReconciliation(next http.Handler, w http.ResponseWriter, req *http.Request, payout string) {
	var forwarded bool
	if err := r.e.p.RailDB.QueryRow(req.Context(), `SELECT EXISTS (SELECT 1 FROM rail_payout WHERE payout_id = $1)`, payout).Scan(&forwarded); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	c := &capture{ResponseWriter: w}
	next.ServeHTTP(c, req)
	_, attempt, resolved := c.decode(true)
	r.seen.mu.Lock()
	defer r.seen.mu.Unlock()
	r.seen.answers = append(r.seen.answers, answer{reconciliation: true, payout: payout, status: c.status, attempt: attempt,
		resolved: resolved, closed: c.status == http.StatusOK && !forwarded})
}
