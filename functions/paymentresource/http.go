package paymentresource

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/ledgeraudit"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpmetrics"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/iso4217"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/overload"
)

// RequestTimeout bounds the database work of one request. A request that
// runs out of time is answered 503 DATABASE_UNAVAILABLE; its transaction
// is rolled back, so retrying it is safe. Running it out also marks paydb
// stalled (internal/overload): until a probe gets an answer, requests are
// answered 503 DATABASE_UNAVAILABLE at once, with Retry-After, instead of
// each waiting this long. 4 s: inside the executor's 5 s
// request timeout (EXECUTOR_REQUEST_TIMEOUT_MS), so that with paydb frozen
// the executor hears this 503 (nothing was written) instead of timing out
// on an outcome it cannot know. One budget: this < the callers' timeout.
const RequestTimeout = 4 * time.Second

// begin admits one request to paydb work and starts its paydb call; call
// it only once the request is decoded and validated, so that bad input is
// answered its own 4xx whatever paydb's state (a malformed body during a
// stall is 400, not 503). It takes a slot of the in-flight bound and asks
// the stall breaker: a request they refuse is answered here, 503 OVERLOADED
// or 503 DATABASE_UNAVAILABLE at once with Retry-After, nothing is done for
// it, and ok is false. Otherwise ctx is the call's context (RequestTimeout,
// cut when paydb is marked stalled meanwhile, overload.Guard.Call) and done
// must be called with the call's error: it records the outcome for the
// breaker and frees the slot. Only its first call counts, so that a
// handler also defers done(errAbandoned): should the call panic, the slot
// is freed all the same and the breaker learns nothing from it.
func (s *Service) begin(w http.ResponseWriter, r *http.Request) (ctx context.Context, done func(error), ok bool) {
	release, reason, ok := s.guard.Admit()
	if !ok {
		err := fmt.Errorf("%w: %d requests in flight", errOverloaded, s.guard.InFlight())
		if reason == overload.ReasonStalled {
			err = fmt.Errorf("%w: %w", ErrUnavailable, errStalled)
		}
		s.fail(w, r, err)
		return nil, nil, false
	}
	ctx, called := s.guard.Call(r.Context(), RequestTimeout, ErrUnavailable)
	return ctx, func(err error) {
		called(err)
		release()
	}, true
}

// routes builds the handler. Patterns carry no method so that a wrong
// method gets the error envelope (405) rather than the mux's plain text.
func (s *Service) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(api.PathAccounts, s.only(http.MethodPost, s.handleCreateAccount))
	mux.HandleFunc(api.PathAccount, s.only(http.MethodGet, s.handleGetAccount))
	mux.HandleFunc(api.PathPayouts, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			s.handleListPayouts(w, r)
			return
		}
		s.only(http.MethodPost, s.handleCreatePayout, api.QueryInclude)(w, r)
	})
	mux.HandleFunc(api.PathPayout, s.only(http.MethodGet, s.handleGetPayout, api.QueryInclude))
	mux.HandleFunc(api.PathClaim, s.only(http.MethodPost, s.handleClaim, api.QueryInclude))
	mux.HandleFunc(api.PathResult, s.only(http.MethodPost, s.handleResult, api.QueryInclude))
	mux.HandleFunc(api.PathAttention, s.only(http.MethodPost, s.handleAttention, api.QueryInclude))
	mux.HandleFunc(api.PathResolution, s.only(http.MethodPost, s.handleResolution, api.QueryInclude))
	mux.HandleFunc(api.PathAudit, s.only(http.MethodGet, s.handleAudit))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, r, fmt.Errorf("%w: %s %s", errNoRoute, r.Method, r.URL.Path))
	})
	// Admission (the in-flight bound, the stall breaker) is each handler's
	// own, once its input has passed (begin); its refusals are counted
	// here like every answer.
	return httpmetrics.Handler(MetricsFunction, httpmetrics.MuxRoutes(mux), mux)
}

// only answers 405 to a method other than method (HEAD counts as GET),
// and 400 INVALID_REQUEST to a query parameter not in allowed (the list
// of payouts reads its own with jsonhandler.Query): one sent anyway is
// refused rather than ignored, so that a client never believes a
// parameter it misspelt, or one this version does not know, was applied.
func (s *Service) only(method string, h http.HandlerFunc, allowed ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method && !(method == http.MethodGet && r.Method == http.MethodHead) {
			w.Header().Set("Allow", method)
			s.fail(w, r, fmt.Errorf("%w: %s %s; use %s", errMethodNotAllowed, r.Method, r.URL.Path, method))
			return
		}
		q, err := jsonhandler.Query(r, allowed...)
		if err == nil && q.Has(api.QueryInclude) && q.Get(api.QueryInclude) != api.IncludeHistory {
			err = fmt.Errorf("query parameter %q: %q is not %q", api.QueryInclude, q.Get(api.QueryInclude), api.IncludeHistory)
		}
		if err != nil {
			s.fail(w, r, fmt.Errorf("%w: %v", ErrInvalidArgument, err))
			return
		}
		h(w, r)
	}
}

func (s *Service) handleCreateAccount(w http.ResponseWriter, r *http.Request) {
	var req api.AccountRequest
	if err := jsonhandler.Decode(w, r, &req, api.MaxBodyBytes); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := invalid(cmp.Or(req.Validate(), iso4217.Check(req.Currency))); err != nil {
		s.fail(w, r, err, "accountId", req.AccountID)
		return
	}
	ctx, done, ok := s.begin(w, r)
	if !ok {
		return
	}
	defer done(errAbandoned)
	a, created, err := s.createAccount(ctx, req)
	done(err)
	if err != nil {
		s.fail(w, r, err, "accountId", req.AccountID)
		return
	}
	jsonhandler.WriteJSON(w, createdStatus(created), a)
}

func (s *Service) handleGetAccount(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := validID("account id", id, api.MaxAccountIDLen); err != nil {
		s.fail(w, r, err)
		return
	}
	ctx, done, ok := s.begin(w, r)
	if !ok {
		return
	}
	defer done(errAbandoned)
	a, err := s.account(ctx, id)
	done(err)
	if err != nil {
		s.fail(w, r, err, "accountId", id)
		return
	}
	jsonhandler.WriteJSON(w, http.StatusOK, a)
}

func (s *Service) handleCreatePayout(w http.ResponseWriter, r *http.Request) {
	var req api.PayoutRequest
	if err := jsonhandler.Decode(w, r, &req, api.MaxBodyBytes); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := invalid(cmp.Or(req.Validate(), iso4217.Check(req.Currency))); err != nil {
		s.fail(w, r, err, "payoutId", req.PayoutID, "accountId", req.AccountID)
		return
	}
	ctx, done, ok := s.begin(w, r)
	if !ok {
		return
	}
	defer done(errAbandoned)
	p, created, err := s.createPayout(ctx, req)
	p, err = s.withHistory(ctx, r, p, err)
	done(err)
	if err != nil {
		s.fail(w, r, err, "payoutId", req.PayoutID, "accountId", req.AccountID)
		return
	}
	s.writePayout(w, createdStatus(created), p)
}

func (s *Service) handleGetPayout(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := validID("payout id", id, api.MaxPayoutIDLen); err != nil {
		s.fail(w, r, err)
		return
	}
	ctx, done, ok := s.begin(w, r)
	if !ok {
		return
	}
	defer done(errAbandoned)
	p, err := s.payout(ctx, id)
	p, err = s.withHistory(ctx, r, p, err)
	done(err)
	if err != nil {
		s.fail(w, r, err, "payoutId", id)
		return
	}
	s.writePayout(w, http.StatusOK, p)
}

func (s *Service) handleClaim(w http.ResponseWriter, r *http.Request) {
	id, h, ok := s.holder(w, r)
	if !ok {
		return
	}
	token, owner := h.Token, h.Owner
	var req api.ClaimRequest
	if err := jsonhandler.DecodeOptional(w, r, &req, api.MaxBodyBytes); err != nil {
		s.fail(w, r, err, "payoutId", id, "token", token, "ownerId", owner)
		return
	}
	if err := invalid(req.Validate()); err != nil {
		s.fail(w, r, err, "payoutId", id, "token", token, "ownerId", owner)
		return
	}
	ctx, done, ok := s.begin(w, r)
	if !ok {
		return
	}
	defer done(errAbandoned)
	p, err := s.claim(ctx, id, h, req)
	p, err = s.withHistory(ctx, r, p, err)
	done(err)
	if err != nil {
		s.fail(w, r, err, "payoutId", id, "token", token, "ownerId", owner)
		return
	}
	s.writePayout(w, http.StatusOK, p)
}

func (s *Service) handleResult(w http.ResponseWriter, r *http.Request) {
	id, h, ok := s.holder(w, r)
	if !ok {
		return
	}
	token, owner := h.Token, h.Owner
	var req api.ResultRequest
	if err := jsonhandler.Decode(w, r, &req, api.MaxBodyBytes); err != nil {
		s.fail(w, r, err, "payoutId", id, "token", token, "ownerId", owner)
		return
	}
	if err := invalid(req.Validate(token)); err != nil {
		s.fail(w, r, err, "payoutId", id, "token", token, "ownerId", owner)
		return
	}
	ctx, done, ok := s.begin(w, r)
	if !ok {
		return
	}
	defer done(errAbandoned)
	p, err := s.result(ctx, id, h, req)
	p, err = s.withHistory(ctx, r, p, err)
	done(err)
	if err != nil {
		s.fail(w, r, err, "payoutId", id, "token", token, "ownerId", owner, "outcome", string(req.Outcome), "railRef", req.RailRef)
		return
	}
	s.writePayout(w, http.StatusOK, p)
}

func (s *Service) handleAttention(w http.ResponseWriter, r *http.Request) {
	id, h, ok := s.holder(w, r)
	if !ok {
		return
	}
	token, owner := h.Token, h.Owner
	var req api.AttentionRequest
	if err := jsonhandler.Decode(w, r, &req, api.MaxBodyBytes); err != nil {
		s.fail(w, r, err, "payoutId", id, "token", token, "ownerId", owner)
		return
	}
	if err := invalid(req.Validate()); err != nil {
		s.fail(w, r, err, "payoutId", id, "token", token, "ownerId", owner)
		return
	}
	ctx, done, ok := s.begin(w, r)
	if !ok {
		return
	}
	defer done(errAbandoned)
	p, err := s.attention(ctx, id, h, req.Reason)
	p, err = s.withHistory(ctx, r, p, err)
	done(err)
	if err != nil {
		s.fail(w, r, err, "payoutId", id, "token", token, "ownerId", owner, "reason", string(req.Reason))
		return
	}
	s.writePayout(w, http.StatusOK, p)
}

func (s *Service) handleResolution(w http.ResponseWriter, r *http.Request) {
	id, h, ok := s.holder(w, r)
	if !ok {
		return
	}
	token, owner := h.Token, h.Owner
	var req api.ResolutionRequest
	if err := jsonhandler.Decode(w, r, &req, api.MaxBodyBytes); err != nil {
		s.fail(w, r, err, "payoutId", id, "token", token, "ownerId", owner)
		return
	}
	if err := invalid(req.Validate(token)); err != nil {
		s.fail(w, r, err, "payoutId", id, "token", token, "ownerId", owner)
		return
	}
	ctx, done, ok := s.begin(w, r)
	if !ok {
		return
	}
	defer done(errAbandoned)
	p, err := s.resolve(ctx, id, h, req)
	p, err = s.withHistory(ctx, r, p, err)
	done(err)
	if err != nil {
		s.fail(w, r, err, "payoutId", id, "token", token, "ownerId", owner, "outcome", string(req.Outcome), "railRef", req.RailRef)
		return
	}
	s.writePayout(w, http.StatusOK, p)
}

func (s *Service) handleListPayouts(w http.ResponseWriter, r *http.Request) {
	q, err := jsonhandler.Query(r, api.QueryState, api.QueryLimit, api.QueryAfter)
	if err != nil {
		s.fail(w, r, fmt.Errorf("%w: %v", ErrInvalidArgument, err))
		return
	}
	state := api.State(q.Get(api.QueryState))
	if !slices.Contains(api.Listable, state) {
		s.fail(w, r, fmt.Errorf("%w: %s %q is not one of %v", ErrInvalidArgument, api.QueryState, state, api.Listable))
		return
	}
	limit := api.DefaultListLimit
	if v := q.Get(api.QueryLimit); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > api.MaxListLimit || strconv.Itoa(n) != v {
			s.fail(w, r, fmt.Errorf("%w: %s %q is not an integer in 1..%d", ErrInvalidArgument, api.QueryLimit, v, api.MaxListLimit))
			return
		}
		limit = n
	}
	after := q.Get(api.QueryAfter)
	if after != "" {
		if err := validID("after", after, api.MaxPayoutIDLen); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	ctx, done, ok := s.begin(w, r)
	if !ok {
		return
	}
	defer done(errAbandoned)
	list, err := s.listPayouts(ctx, state, limit, after)
	done(err)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.writePayouts(w, list)
}

func (s *Service) handleAudit(w http.ResponseWriter, r *http.Request) {
	// Behind the breaker like every route that needs paydb: an operator's
	// read is no reason to wait out a stall.
	ctx, done, ok := s.begin(w, r)
	if !ok {
		return
	}
	defer done(errAbandoned)
	rep, err := ledgeraudit.Run(ctx, s.pool)
	if errors.Is(err, ledgeraudit.ErrUnavailable) {
		err = fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	done(err)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !rep.Balanced {
		s.log.WarnContext(ctx, "ledger audit found violations", "event", api.EventAuditUnbalanced, "violations", len(rep.Violations))
	}
	jsonhandler.WriteJSON(w, http.StatusOK, rep)
}

// holder reads the payout id of the path and the lock holder's token,
// proof and owner headers; it answers the error itself and returns ok=false when one
// is invalid. A malformed owner (fencing.ErrBadOwner) is 400
// INVALID_REQUEST, as lock-server answers the same owner: it is refused,
// never cut, so that nothing a client sends for the logs reaches paydb
// unchecked.
func (s *Service) holder(w http.ResponseWriter, r *http.Request) (id string, h fencewire.Holder, ok bool) {
	id = r.PathValue("id")
	if err := validID("payout id", id, api.MaxPayoutIDLen); err != nil {
		s.fail(w, r, err)
		return "", h, false
	}
	owner, err := fencing.OwnerFrom(r)
	if err != nil {
		s.fail(w, r, fmt.Errorf("%w: %w", ErrInvalidArgument, err), "payoutId", id)
		return "", h, false
	}
	token, err := fencing.TokenFrom(r)
	if err != nil {
		s.fail(w, r, err, "payoutId", id, "ownerId", owner)
		return "", h, false
	}
	// The proof's form is judged here, before admission (begin), so that
	// a missing or malformed proof is 403 UNVERIFIED_TOKEN during a paydb
	// stall too; its signature needs the payout's account (verifyToken).
	proof, err := fencing.ProofFrom(r)
	if err == nil && s.fencing {
		err = fencing.CheckProof(proof)
	}
	if err != nil && s.fencing {
		fencing.LogUnverified(r.Context(), s.log, "payout", id, token, owner, err, "payoutId", id)
		s.fail(w, r, fmt.Errorf("%w: %w", ErrUnverifiedToken, err), "payoutId", id, "ownerId", owner)
		return "", h, false
	}
	return id, fencewire.Holder{Token: token, Proof: proof, Owner: owner}, true
}

func createdStatus(created bool) int {
	if created {
		return http.StatusCreated
	}
	return http.StatusOK
}

// fail answers err with the error envelope and logs the refusal (5xx at
// ERROR; fenced_out has already been logged at WARN by the fence point).
// A 5xx answer carries a generic message (serverMessage): the cause (a
// driver's error text, SQL, a socket address) goes to the log only.
func (s *Service) fail(w http.ResponseWriter, r *http.Request, err error, attrs ...any) {
	status, code, retryable := statusOf(err)
	if code == api.CodeUnavailable && errors.Is(r.Context().Err(), context.Canceled) {
		// The caller went away (it cancelled, or closed its connection)
		// before the answer: not paydb's failure.
		status, code, retryable = api.StatusRequestCancelled, api.CodeRequestCancelled, false
	}
	msg := jsonhandler.ClientMessage(err)
	if status >= 500 || code == api.CodeRequestCancelled {
		msg = serverMessage(code)
	}
	attrs = append([]any{"status", status, "code", string(code), "method", r.Method, "path", r.URL.Path, "error", err.Error()}, attrs...)
	switch {
	case errors.Is(err, errOverloaded) || errors.Is(err, errStalled):
		// Shed at once: one line per refused request would flood the log
		// exactly when the service is in trouble; backend_stalled and the
		// gauges tell it once.
		s.log.DebugContext(r.Context(), "request shed", append([]any{"event", api.EventRequestFailed}, attrs...)...)
	case status >= 500:
		s.log.ErrorContext(r.Context(), "request failed", append([]any{"event", api.EventRequestFailed}, attrs...)...)
	case code == api.CodeFencedOut:
		s.log.DebugContext(r.Context(), "request refused", append([]any{"event", api.EventRequestRefused}, attrs...)...)
	default:
		s.log.InfoContext(r.Context(), "request refused", append([]any{"event", api.EventRequestRefused}, attrs...)...)
	}
	if status == http.StatusServiceUnavailable && retryable {
		overload.SetRetryAfter(w.Header())
	}
	jsonhandler.WriteJSON(w, status, api.ErrorEnvelope{Error: api.ErrorBody{Code: code, Message: msg, Retryable: retryable}})
}

// serverMessage is the message of a 5xx (or 499) answer with code: fixed
// text that says what the caller may do, never the cause.
func serverMessage(code api.Code) string {
	switch code {
	case api.CodeUnavailable:
		return "paydb did not answer in time; nothing was committed, the same request may be sent again"
	case api.CodeOverloaded:
		return "too many requests in flight; nothing was done, the same request may be sent again after Retry-After"
	case api.CodeRequestCancelled:
		return "the request ended before paydb answered; its outcome is unknown to the caller"
	}
	return "internal error; the cause is in payment-resource's log (request_failed)"
}

// statusOf maps an error to its HTTP status, stable code and retryability:
// the one place where errors become HTTP answers.
func statusOf(err error) (status int, code api.Code, retryable bool) {
	var decodeErr *jsonhandler.Error
	switch {
	case errors.As(err, &decodeErr):
		return decodeErr.Status, api.Code(decodeErr.Code), false
	case errors.Is(err, fencing.ErrMissingToken), errors.Is(err, fencing.ErrBadToken):
		return http.StatusBadRequest, api.CodeInvalidToken, false
	case errors.Is(err, ErrInvalidArgument):
		return http.StatusBadRequest, api.CodeInvalidRequest, false
	case errors.Is(err, errNoRoute):
		return http.StatusNotFound, api.CodeNotFound, false
	case errors.Is(err, errMethodNotAllowed):
		return http.StatusMethodNotAllowed, api.CodeMethodNotAllowed, false
	case errors.Is(err, ErrAccountNotFound):
		return http.StatusNotFound, api.CodeAccountNotFound, false
	case errors.Is(err, ErrAccountConflict):
		return http.StatusConflict, api.CodeAccountConflict, false
	case errors.Is(err, ErrCurrencyMismatch):
		return http.StatusUnprocessableEntity, api.CodeCurrencyMismatch, false
	case errors.Is(err, ErrInsufficientFunds):
		return http.StatusConflict, api.CodeInsufficientFunds, false
	case errors.Is(err, ErrPayoutNotFound):
		return http.StatusNotFound, api.CodePayoutNotFound, false
	case errors.Is(err, ErrPayoutConflict):
		return http.StatusConflict, api.CodePayoutConflict, false
	case errors.Is(err, ErrTermsMismatch):
		return http.StatusConflict, api.CodePayoutTermsMismatch, false
	case errors.Is(err, ErrFencedOut):
		return http.StatusConflict, api.CodeFencedOut, false
	case errors.Is(err, ErrPayoutFinished):
		return http.StatusConflict, api.CodePayoutFinished, false
	case errors.Is(err, ErrPayoutInDoubt):
		return http.StatusConflict, api.CodePayoutInDoubt, false
	case errors.Is(err, ErrPayoutNeedsAttention):
		return http.StatusConflict, api.CodePayoutNeedsAttention, false
	case errors.Is(err, ErrPayoutNotClaimed):
		return http.StatusConflict, api.CodePayoutNotClaimed, false
	case errors.Is(err, ErrRailRefConflict):
		return http.StatusConflict, api.CodeRailRefConflict, false
	case errors.Is(err, ErrUnverifiedToken):
		return http.StatusForbidden, api.CodeUnverifiedToken, false
	case errors.Is(err, ErrInvalidReceipt):
		return http.StatusUnprocessableEntity, api.CodeInvalidReceipt, false
	case errors.Is(err, ErrUnavailable), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return http.StatusServiceUnavailable, api.CodeUnavailable, true
	case errors.Is(err, errOverloaded):
		return http.StatusServiceUnavailable, api.CodeOverloaded, true
	default:
		return http.StatusInternalServerError, api.CodeInternal, false
	}
}

// validID checks an account or payout id of the path
// (payoutevent.ValidateID).
func validID(what, v string, max int) error {
	if err := payoutevent.ValidateID(what, v, max); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	return nil
}

// invalid wraps a validation error of the api package in
// ErrInvalidArgument (400 INVALID_REQUEST); nil stays nil.
func invalid(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
}

// MetricsFunction is this function's value of the function label of the
// request metrics (package httpmetrics).
const MetricsFunction = "payment-resource"

// withHistory returns p with its history when the request asked for it
// (api.QueryInclude, checked by only) and err is nil; p and err as they
// are otherwise.
func (s *Service) withHistory(ctx context.Context, r *http.Request, p api.Payout, err error) (api.Payout, error) {
	if err != nil || r.URL.Query().Get(api.QueryInclude) != api.IncludeHistory {
		return p, err
	}
	p.History, err = s.history(ctx, p.PayoutID)
	return p, err
}
