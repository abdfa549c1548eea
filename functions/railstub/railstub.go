// Package railstub is the lab's external payment rail (rail-stub): a
// deliberately non-idempotent implementation of functions/rail, with a
// journal (Config.JournalPath) and fault injection (PathFaults, Faults) for
// tests and experiments. Serve New's Stub; read its record with
// Submissions. docs/payout-pipeline.md describes its journal, stop orders
// and faults.
package railstub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpmetrics"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/iso4217"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
)

// Environment variables read by LoadConfig.
const (
	// EnvDeclineOverMinor sets Config.DeclineOverMinor (int64, minor units).
	EnvDeclineOverMinor = "RAIL_STUB_DECLINE_OVER_MINOR"
	// EnvDeclineAccounts sets Config.DeclineAccounts (comma-separated ids).
	EnvDeclineAccounts = "RAIL_STUB_DECLINE_ACCOUNTS"
	// EnvLatencyMs sets Config.Latency (milliseconds).
	EnvLatencyMs = "RAIL_STUB_LATENCY_MS"
	// EnvJournal sets Config.JournalPath.
	EnvJournal = "RAIL_STUB_JOURNAL"
)

// Defaults and bounds of Config.
const (
	// DefaultDeclineOverMinor is the default of Config.DeclineOverMinor:
	// 1,000,000 minor units (10,000.00 in a two-decimal currency).
	DefaultDeclineOverMinor int64 = 1_000_000
	// MaxLatency bounds Config.Latency and Faults.LatencyMs: 10 minutes, far
	// beyond any caller's timeout, so a typo cannot park requests for days.
	MaxLatency = 10 * time.Minute
	// MaxFailNext bounds Faults.FailNext: a test never needs more
	// failures in a row, and a typo (int64's maximum) would otherwise
	// break the rail for good.
	MaxFailNext = 10_000
)

// Fault modes of Faults.Mode.
const (
	// FaultError answers 503 RAIL_UNAVAILABLE without recording.
	FaultError = "error"
	// FaultHang records the submission, then withholds the answer until the
	// request's context ends (or the stub is closed).
	FaultHang = "hang"
)

// Errors of this package.
var (
	// ErrInvalidConfig: a Config field is out of bounds or an environment
	// variable does not parse.
	ErrInvalidConfig = errors.New("railstub: invalid config")
	// ErrInvalidSubmission: a submission is malformed; it is not recorded.
	ErrInvalidSubmission = errors.New("railstub: invalid submission")
	// ErrInvalidFaults: a fault setting is malformed; nothing changes.
	ErrInvalidFaults = errors.New("railstub: invalid faults")
	// ErrInjectedFailure: an "error" fault refused the submission; it is
	// not recorded.
	ErrInjectedFailure = errors.New("railstub: injected failure")
	// ErrReferenceStopped: the submission's reference has a stop order; it
	// is not recorded.
	ErrReferenceStopped = errors.New("railstub: reference stopped")
	// ErrJournal: the journal could not be read, written or synced.
	ErrJournal = errors.New("railstub: journal")
	// ErrClosed: the stub is closed.
	ErrClosed = errors.New("railstub: closed")
	// errNotFound and errMethod are routing refusals.
	errNotFound = errors.New("railstub: no such route")
	errMethod   = errors.New("railstub: method not allowed")
	// errQuery: a query parameter the route does not take, or a malformed
	// query string (400 INVALID_REQUEST).
	errQuery = errors.New("railstub: invalid query")
)

// PathFaults is rail-stub's own fault-injection route: GET answers the
// fault state, POST Faults replaces it (400 INVALID_REQUEST when invalid).
// The rail's routes are functions/rail's.
const PathFaults = "/admin/faults"

// Config configures a Stub. Start from DefaultConfig or LoadConfig; the
// zero value is not valid (DeclineOverMinor must be positive).
type Config struct {
	// DeclineOverMinor: a submission whose amountMinor is greater than this
	// (minor currency units) is answered DECLINE. Must be positive. Default
	// DefaultDeclineOverMinor. Env RAIL_STUB_DECLINE_OVER_MINOR.
	DeclineOverMinor int64
	// DeclineAccounts: submissions for these account ids are answered
	// DECLINE. Default none. Env RAIL_STUB_DECLINE_ACCOUNTS (comma list;
	// blanks around ids are trimmed, empty items skipped).
	DeclineAccounts []string
	// Latency is added before every answer to an accepted submission (after
	// it is recorded) and before an injected 503. At most MaxLatency; the
	// POST /admin/faults latencyMs replaces it at runtime. Default 0. Env
	// RAIL_STUB_LATENCY_MS (milliseconds).
	Latency time.Duration
	// JournalPath, when set, is the JSON Lines file every record is
	// appended to (fsynced before the answer) and reloaded from at start.
	// Empty keeps records in memory only, lost on restart. Env
	// RAIL_STUB_JOURNAL.
	JournalPath string
}

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{DeclineOverMinor: DefaultDeclineOverMinor}
}

// EnvNames returns the environment variables LoadConfig reads, for
// envcheck.
func EnvNames() []string {
	return []string{EnvDeclineOverMinor, EnvDeclineAccounts, EnvLatencyMs, EnvJournal}
}

// Validate returns nil or one error per invalid field, joined
// (errors.Join), each wrapping ErrInvalidConfig and naming the field and
// its environment variable.
func (c Config) Validate() error {
	var errs []error
	if c.DeclineOverMinor <= 0 {
		errs = append(errs, fmt.Errorf("%w: DeclineOverMinor (%s) %d is not positive", ErrInvalidConfig, EnvDeclineOverMinor, c.DeclineOverMinor))
	}
	for _, a := range c.DeclineAccounts {
		if a == "" || len(a) > rail.MaxAccountIDLen {
			errs = append(errs, fmt.Errorf("%w: DeclineAccounts (%s) entry %q must be 1..%d bytes", ErrInvalidConfig, EnvDeclineAccounts, a, rail.MaxAccountIDLen))
		}
	}
	if c.Latency < 0 || c.Latency > MaxLatency {
		errs = append(errs, fmt.Errorf("%w: Latency (%s) %v must be in [0, %v]", ErrInvalidConfig, EnvLatencyMs, c.Latency, MaxLatency))
	}
	return errors.Join(errs...)
}

// LoadConfig returns DefaultConfig overridden by the variables of EnvNames
// (RAIL_STUB_DECLINE_OVER_MINOR, RAIL_STUB_DECLINE_ACCOUNTS,
// RAIL_STUB_LATENCY_MS, RAIL_STUB_JOURNAL), read through getenv (an empty
// value keeps the default), then validated. It reports every unparsable
// variable and every invalid field at once, joined; each error wraps
// ErrInvalidConfig and names the variable to fix.
func LoadConfig(getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	var errs []error
	if v := strings.TrimSpace(getenv(EnvDeclineOverMinor)); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: %s=%q is not an integer", ErrInvalidConfig, EnvDeclineOverMinor, v))
		} else {
			c.DeclineOverMinor = n
		}
	}
	for a := range strings.SplitSeq(getenv(EnvDeclineAccounts), ",") {
		if a = strings.TrimSpace(a); a != "" {
			c.DeclineAccounts = append(c.DeclineAccounts, a)
		}
	}
	if v := strings.TrimSpace(getenv(EnvLatencyMs)); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > MaxLatency.Milliseconds() {
			errs = append(errs, fmt.Errorf("%w: %s=%q must be milliseconds in [0, %d]", ErrInvalidConfig, EnvLatencyMs, v, MaxLatency.Milliseconds()))
		} else {
			c.Latency = time.Duration(n) * time.Millisecond
		}
	}
	c.JournalPath = strings.TrimSpace(getenv(EnvJournal))
	if err := errors.Join(append(errs, c.Validate())...); err != nil {
		return Config{}, err
	}
	return c, nil
}

// validSubmission returns an error wrapping ErrInvalidSubmission
// describing the first invalid field of s.
func validSubmission(s rail.SubmitRequest) error {
	switch {
	case !textOK(s.PayoutID, rail.MaxPayoutIDLen):
		return fmt.Errorf("%w: payoutId must be 1..%d bytes of UTF-8 text without control characters", ErrInvalidSubmission, rail.MaxPayoutIDLen)
	case !textOK(s.AccountID, rail.MaxAccountIDLen):
		return fmt.Errorf("%w: accountId must be 1..%d bytes of UTF-8 text without control characters", ErrInvalidSubmission, rail.MaxAccountIDLen)
	case s.AmountMinor <= 0:
		return fmt.Errorf("%w: amountMinor %d is not positive", ErrInvalidSubmission, s.AmountMinor)
	case iso4217.Check(s.Currency) != nil:
		return fmt.Errorf("%w: %v", ErrInvalidSubmission, iso4217.Check(s.Currency))
	case !textOK(s.Reference, rail.MaxReferenceLen):
		return fmt.Errorf("%w: reference must be 1..%d bytes of UTF-8 text without control characters", ErrInvalidSubmission, rail.MaxReferenceLen)
	}
	return nil
}

// textOK is the project's rule for stored free text (jsonhandler.Text): 1..max
// bytes of UTF-8, no control character (NUL, newline, ...), no U+FFFD.
// Together with jsonhandler.Decode's refusal of strings that are not UTF-8,
// nothing the journal records was rewritten on the way in.
func textOK(s string, max int) bool { return jsonhandler.Text(s, max) }

// Faults is the body of POST /admin/faults and of both answers of
// /admin/faults. A POST replaces the whole fault state: an absent field is
// zero, so {} clears every fault (and the configured latency).
type Faults struct {
	// LatencyMs is added before every answer of POST /submit, in
	// milliseconds; 0..MaxLatency.
	LatencyMs int64 `json:"latencyMs"`
	// FailNext is how many of the next valid submissions fail in Mode
	// (each failure consumes one); 0..MaxFailNext. Invalid submissions
	// consume none.
	FailNext int `json:"failNext"`
	// Mode is FaultError or FaultHang; required when FailNext > 0.
	Mode string `json:"mode,omitempty"`
}

// Validate returns an error wrapping ErrInvalidFaults describing the first
// invalid field.
func (f Faults) Validate() error {
	switch {
	case f.LatencyMs < 0 || f.LatencyMs > MaxLatency.Milliseconds():
		return fmt.Errorf("%w: latencyMs %d must be in [0, %d]", ErrInvalidFaults, f.LatencyMs, MaxLatency.Milliseconds())
	case f.FailNext < 0 || f.FailNext > MaxFailNext:
		return fmt.Errorf("%w: failNext %d must be in [0, %d]", ErrInvalidFaults, f.FailNext, MaxFailNext)
	case f.Mode != "" && f.Mode != FaultError && f.Mode != FaultHang:
		return fmt.Errorf("%w: mode %q: want %q or %q", ErrInvalidFaults, f.Mode, FaultError, FaultHang)
	case f.FailNext > 0 && f.Mode == "":
		return fmt.Errorf("%w: failNext %d needs a mode", ErrInvalidFaults, f.FailNext)
	}
	return nil
}

// Stub is the rail. It is an http.Handler, safe for concurrent use. It
// starts no goroutine; Close releases the requests a "hang" fault holds and
// closes the journal.
type Stub struct {
	log      *slog.Logger
	decline  map[string]bool
	overMin  int64
	mux      *http.ServeMux
	metered  http.Handler  // mux, counted by httpmetrics
	closing  chan struct{} // closed by Close: releases held requests
	closeOne sync.Once

	mu      sync.Mutex
	faults  Faults
	records []rail.Submission
	stopped map[string]bool // references with a stop order
	perID   map[string]int  // submissions recorded per payout id, reloaded ones included (not stop orders)
	journal *journal        // nil without JournalPath, or after Close
	broken  error           // set by the first journal failure; refuses all later submissions
	closed  bool
}

// New returns a Stub for cfg, with the records of cfg.JournalPath reloaded
// (the file is created when missing; a torn last line, left by a crash
// before its fsync completed, is cut off with a warning since its answer
// was never sent). It returns an error wrapping ErrInvalidConfig for an
// invalid cfg or a nil logger, or ErrJournal when the journal cannot be
// opened or holds a malformed record.
func New(cfg Config, log *slog.Logger) (*Stub, error) {
	if log == nil {
		return nil, fmt.Errorf("%w: nil logger", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Stub{
		log:     log,
		decline: make(map[string]bool, len(cfg.DeclineAccounts)),
		overMin: cfg.DeclineOverMinor,
		mux:     http.NewServeMux(),
		closing: make(chan struct{}),
		faults:  Faults{LatencyMs: cfg.Latency.Milliseconds()},
		stopped: map[string]bool{},
		perID:   map[string]int{},
	}
	for _, a := range cfg.DeclineAccounts {
		s.decline[a] = true
	}
	if cfg.JournalPath != "" {
		j, recs, err := openJournal(cfg.JournalPath, log)
		if err != nil {
			return nil, err
		}
		s.journal, s.records = j, recs
		for _, r := range recs {
			if r.Stop {
				s.stopped[r.Request.Reference] = true
			} else {
				s.perID[r.Request.PayoutID]++
			}
		}
		log.Info("rail stub journal reloaded", "event", EventJournalReloaded, "path", cfg.JournalPath, "submissions", len(recs))
	}
	s.mux.HandleFunc(rail.PathSubmit, s.query(s.handleSubmit))
	s.mux.HandleFunc(rail.PathJournal, s.query(s.handleSubmissions, rail.QueryPayoutID))
	s.mux.HandleFunc(rail.PathStops, s.query(s.handleStops))
	s.mux.HandleFunc(PathFaults, s.query(s.handleFaults))
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, fmt.Errorf("%w: %s %s", errNotFound, r.Method, r.URL.Path))
	})
	s.metered = httpmetrics.Handler(MetricsFunction, httpmetrics.MuxRoutes(s.mux), s.mux)
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Stub) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.metered.ServeHTTP(w, r) }

// Close makes every later submission fail with ErrClosed, releases the
// requests held by a "hang" fault (answered 503 STUB_CLOSED; they stay
// recorded) and closes the journal. It is idempotent and returns the
// journal's close error.
func (s *Stub) Close() error {
	s.closeOne.Do(func() { close(s.closing) })
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.journal == nil {
		return nil
	}
	j := s.journal
	s.journal = nil
	return j.close()
}

// Submissions returns a copy of the records in sequence order; with a
// non-empty payoutID only that payout's.
func (s *Stub) Submissions(payoutID string) []rail.Submission {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]rail.Submission, 0, len(s.records))
	for _, r := range s.records {
		if !r.Stop && (payoutID == "" || r.Request.PayoutID == payoutID) {
			out = append(out, r)
		}
	}
	return out
}

func (s *Stub) handleSubmit(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		s.methodNotAllowed(w, r, http.MethodPost)
		return
	}
	var req rail.SubmitRequest
	if err := jsonhandler.Decode(w, r, &req, rail.MaxBodyBytes); err != nil {
		s.fail(w, err)
		return
	}
	if err := validSubmission(req); err != nil {
		s.fail(w, err)
		return
	}
	rec, latency, mode, err := s.record(req)
	if err != nil {
		if errors.Is(err, ErrInjectedFailure) {
			s.wait(r.Context(), latency)
		}
		s.fail(w, err)
		return
	}
	attrs := []any{"seq", rec.Seq, "payoutId", req.PayoutID, "accountId", req.AccountID,
		"amountMinor", req.AmountMinor, "currency", req.Currency, "status", rec.Answer.Status, "railRef", rec.Answer.RailRef}
	if mode == FaultHang {
		s.log.WarnContext(r.Context(), "rail submission recorded; answer withheld", append([]any{"event", EventAnswerWithheld}, attrs...)...)
		select {
		case <-r.Context().Done():
			// The caller gave up: it will never learn that the money moved.
		case <-s.closing:
			s.fail(w, fmt.Errorf("%w: held submission %s released", ErrClosed, rec.Answer.RailRef))
		}
		return
	}
	s.log.DebugContext(r.Context(), "rail submission recorded", append([]any{"event", EventSubmissionRecorded}, attrs...)...)
	if !s.wait(r.Context(), latency) {
		return // the caller gave up during the latency; the record stands
	}
	jsonhandler.WriteJSON(w, http.StatusOK, rec.Answer)
}

// record applies the fault state and the answer rules to req and, unless an
// "error" fault refuses it, records it (journal first, memory second). It
// returns the record, the latency to add and the fault mode applied ("" for
// none).
func (s *Stub) record(req rail.SubmitRequest) (rail.Submission, time.Duration, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	latency := time.Duration(s.faults.LatencyMs) * time.Millisecond
	switch {
	case s.closed:
		return rail.Submission{}, 0, "", ErrClosed
	case s.broken != nil:
		return rail.Submission{}, 0, "", fmt.Errorf("%w: refusing submissions after an earlier failure (restart the stub): %v", ErrJournal, s.broken)
	}
	mode := ""
	if s.faults.FailNext > 0 {
		mode = s.faults.Mode
		s.faults.FailNext--
		if s.faults.FailNext == 0 {
			s.faults.Mode = ""
		}
	}
	if mode == FaultError {
		return rail.Submission{}, latency, mode, fmt.Errorf("%w: %s fault (%d more to come)", ErrInjectedFailure, mode, s.faults.FailNext)
	}
	if s.stopped[req.Reference] {
		return rail.Submission{}, 0, "", fmt.Errorf("%w: reference %q", ErrReferenceStopped, req.Reference)
	}
	seq := int64(len(s.records)) + 1
	status := rail.StatusAck
	if req.AmountMinor > s.overMin || s.decline[req.AccountID] {
		status = rail.StatusDecline
	}
	rec := rail.Submission{
		Seq:        seq,
		ReceivedAt: time.Now().UTC(),
		Request:    req,
		Answer:     rail.SubmitAnswer{Status: status, RailRef: fmt.Sprintf("rail-%06d", seq)},
		Withheld:   mode == FaultHang,
	}
	if s.journal != nil {
		if err := s.journal.append(rec); err != nil {
			// Memory and disk may now disagree (a partial line, an unknown
			// fsync outcome); refuse everything until a restart reloads the
			// journal, which then decides what happened.
			s.broken = err
			s.log.Error("rail stub journal failed; refusing submissions until restart", "event", EventJournalFailed, "error", err.Error())
			return rail.Submission{}, 0, "", err
		}
	}
	s.records = append(s.records, rec)
	s.count(req.PayoutID)
	return rec, latency, mode, nil
}

// wait blocks for d, or until ctx ends or the stub closes; it reports
// whether the whole of d passed.
func (s *Stub) wait(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-s.closing:
		return true
	}
}

// Stop records a stop order for reference (journal first, as a payment
// is recorded) and returns the payments recorded with that reference
// before it. Under the same lock as every payment, so that no submission
// of the reference can be recorded after the answer: what the answer
// lists is final. A reference stopped before is stopped again without a
// new record. Errors: ErrInvalidSubmission (a bad reference), ErrClosed,
// ErrJournal.
func (s *Stub) Stop(reference string) (rail.StopAnswer, error) {
	if !textOK(reference, rail.MaxReferenceLen) {
		return rail.StopAnswer{}, fmt.Errorf("%w: reference must be 1..%d bytes of UTF-8", ErrInvalidSubmission, rail.MaxReferenceLen)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return rail.StopAnswer{}, ErrClosed
	case s.broken != nil:
		return rail.StopAnswer{}, fmt.Errorf("%w: refusing stop orders after an earlier failure (restart the stub): %v", ErrJournal, s.broken)
	}
	if !s.stopped[reference] {
		rec := rail.Submission{Seq: int64(len(s.records)) + 1, ReceivedAt: time.Now().UTC(), Request: rail.SubmitRequest{Reference: reference},
			Answer: rail.SubmitAnswer{Status: rail.StatusStopped}, Stop: true}
		if s.journal != nil {
			if err := s.journal.append(rec); err != nil {
				s.broken = err
				s.log.Error("rail stub journal failed; refusing submissions until restart", "event", EventJournalFailed, "error", err.Error())
				return rail.StopAnswer{}, err
			}
		}
		s.records = append(s.records, rec)
		s.stopped[reference] = true
	}
	ans := rail.StopAnswer{Reference: reference, Submissions: []rail.Submission{}}
	for _, r := range s.records {
		if !r.Stop && r.Request.Reference == reference {
			ans.Submissions = append(ans.Submissions, r)
		}
	}
	return ans, nil
}

func (s *Stub) handleStops(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		s.methodNotAllowed(w, r, http.MethodPost)
		return
	}
	var req rail.StopRequest
	if err := jsonhandler.Decode(w, r, &req, rail.MaxBodyBytes); err != nil {
		s.fail(w, err)
		return
	}
	ans, err := s.Stop(req.Reference)
	if err != nil {
		s.fail(w, err)
		return
	}
	s.log.WarnContext(r.Context(), "rail stop order recorded; later submissions of the reference are refused", "event", EventReferenceStopped,
		"reference", req.Reference, "submissions", len(ans.Submissions))
	jsonhandler.WriteJSON(w, http.StatusOK, ans)
}

func (s *Stub) handleSubmissions(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		s.methodNotAllowed(w, r, http.MethodGet)
		return
	}
	jsonhandler.WriteJSON(w, http.StatusOK, rail.SubmissionList{Submissions: s.Submissions(r.URL.Query().Get(rail.QueryPayoutID))})
}

func (s *Stub) handleFaults(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		s.mu.Lock()
		f := s.faults
		s.mu.Unlock()
		jsonhandler.WriteJSON(w, http.StatusOK, f)
	case http.MethodPost:
		var f Faults
		if err := jsonhandler.Decode(w, r, &f, rail.MaxBodyBytes); err != nil {
			s.fail(w, err)
			return
		}
		if err := f.Validate(); err != nil {
			s.fail(w, err)
			return
		}
		if f.FailNext == 0 {
			f.Mode = ""
		}
		s.mu.Lock()
		s.faults = f
		s.mu.Unlock()
		s.log.WarnContext(r.Context(), "rail stub faults set", "event", EventFaultsSet, "latencyMs", f.LatencyMs, "failNext", f.FailNext, "mode", f.Mode)
		jsonhandler.WriteJSON(w, http.StatusOK, f)
	default:
		s.methodNotAllowed(w, r, "GET, POST")
	}
}

// query refuses, with 400 INVALID_REQUEST, a request whose query string
// is malformed or has a parameter not in allowed (jsonhandler.Query), before
// h sees it: a parameter the client sent is never silently ignored.
func (s *Stub) query(h http.HandlerFunc, allowed ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, err := jsonhandler.Query(r, allowed...); err != nil {
			s.fail(w, fmt.Errorf("%w: %v", errQuery, err))
			return
		}
		h(w, r)
	}
}

func (s *Stub) methodNotAllowed(w http.ResponseWriter, r *http.Request, allowed string) {
	w.Header().Set("Allow", allowed)
	s.fail(w, fmt.Errorf("%w: %s %s; use %s", errMethod, r.Method, r.URL.Path, allowed))
}

// fail answers err with the envelope, through statusOf. A 5xx answer
// carries a fixed message; the cause (a journal's path, an I/O error) is
// in the log only.
func (s *Stub) fail(w http.ResponseWriter, err error) {
	status, code, retryable := statusOf(err)
	msg := jsonhandler.ClientMessage(err)
	if status >= 500 && code != rail.CodeUnavailable {
		s.log.Error("rail stub request failed", "event", EventRequestFailed, "code", code, "error", err.Error())
	}
	switch {
	case status < 500:
	case code == rail.CodeUnavailable:
		msg = "the rail is unavailable (injected fault); nothing was recorded"
	case code == rail.CodeStubClosed:
		msg = "the rail stub is closing; nothing was recorded"
	case code == rail.CodeJournalFailed:
		msg = "the journal could not be written; submissions are refused until the stub restarts (the cause is in its log)"
	default:
		msg = "internal error; the cause is in rail-stub's log (rail_request_failed)"
	}
	jsonhandler.WriteError(w, status, code, msg, retryable)
}

// statusOf maps an error to its HTTP status, code and retryability: the
// one place where the stub's errors become answers.
func statusOf(err error) (status int, code string, retryable bool) {
	var decodeErr *jsonhandler.Error
	switch {
	case errors.As(err, &decodeErr):
		return decodeErr.Status, decodeErr.Code, false
	case errors.Is(err, ErrInvalidSubmission), errors.Is(err, ErrInvalidFaults), errors.Is(err, errQuery):
		return http.StatusBadRequest, jsonhandler.CodeInvalidRequest, false
	case errors.Is(err, errNotFound):
		return http.StatusNotFound, rail.CodeNotFound, false
	case errors.Is(err, errMethod):
		return http.StatusMethodNotAllowed, rail.CodeMethodNotAllowed, false
	case errors.Is(err, ErrInjectedFailure):
		return http.StatusServiceUnavailable, rail.CodeUnavailable, true
	case errors.Is(err, ErrReferenceStopped):
		return http.StatusConflict, rail.CodeReferenceStopped, false
	case errors.Is(err, ErrClosed):
		return http.StatusServiceUnavailable, rail.CodeStubClosed, false
	case errors.Is(err, ErrJournal):
		return http.StatusInternalServerError, rail.CodeJournalFailed, false
	default:
		return http.StatusInternalServerError, rail.CodeInternal, false
	}
}

// MetricsFunction is this function's value of the function label of the
// request metrics (package httpmetrics).
const MetricsFunction = "rail-stub"
