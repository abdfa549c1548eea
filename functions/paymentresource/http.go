package paymentresource

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpjson"
)

// requestTimeout bounds the database work of one request. A request that
// runs out of time is answered 503 DATABASE_UNAVAILABLE; its transaction
// is rolled back, so retrying it is safe.
const requestTimeout = 10 * time.Second

// routes builds the handler. Patterns carry no method so that a wrong
// method gets the error envelope (405) rather than the mux's plain text.
func (s *Service) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(PathAccounts, s.only(http.MethodPost, s.handleCreateAccount))
	mux.HandleFunc(PathAccount, s.only(http.MethodGet, s.handleGetAccount))
	mux.HandleFunc(PathPayouts, s.only(http.MethodPost, s.handleCreatePayout))
	mux.HandleFunc(PathPayout, s.only(http.MethodGet, s.handleGetPayout))
	mux.HandleFunc(PathClaim, s.only(http.MethodPost, s.handleClaim))
	mux.HandleFunc(PathResult, s.only(http.MethodPost, s.handleResult))
	mux.HandleFunc(PathAudit, s.only(http.MethodGet, s.handleAudit))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, r, fmt.Errorf("%w: %s %s", errNoRoute, r.Method, r.URL.Path))
	})
	return mux
}

// only answers 405 to a method other than method (HEAD counts as GET).
func (s *Service) only(method string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method && !(method == http.MethodGet && r.Method == http.MethodHead) {
			w.Header().Set("Allow", method)
			s.fail(w, r, fmt.Errorf("%w: %s %s; use %s", errMethodNotAllowed, r.Method, r.URL.Path, method))
			return
		}
		h(w, r)
	}
}

func (s *Service) handleCreateAccount(w http.ResponseWriter, r *http.Request) {
	var req AccountRequest
	if err := httpjson.Decode(w, r, &req, MaxBodyBytes); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := validateAccount(req); err != nil {
		s.fail(w, r, err, "accountId", req.AccountID)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	a, created, err := s.createAccount(ctx, req)
	if err != nil {
		s.fail(w, r, err, "accountId", req.AccountID)
		return
	}
	httpjson.WriteJSON(w, createdStatus(created), a)
}

func (s *Service) handleGetAccount(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := validID("account id", id, MaxAccountIDLen); err != nil {
		s.fail(w, r, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	a, err := s.account(ctx, id)
	if err != nil {
		s.fail(w, r, err, "accountId", id)
		return
	}
	httpjson.WriteJSON(w, http.StatusOK, a)
}

func (s *Service) handleCreatePayout(w http.ResponseWriter, r *http.Request) {
	var req PayoutRequest
	if err := httpjson.Decode(w, r, &req, MaxBodyBytes); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := validatePayout(req); err != nil {
		s.fail(w, r, err, "payoutId", req.PayoutID, "accountId", req.AccountID)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	p, created, err := s.createPayout(ctx, req)
	if err != nil {
		s.fail(w, r, err, "payoutId", req.PayoutID, "accountId", req.AccountID)
		return
	}
	httpjson.WriteJSON(w, createdStatus(created), p)
}

func (s *Service) handleGetPayout(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := validID("payout id", id, MaxPayoutIDLen); err != nil {
		s.fail(w, r, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	p, err := s.payout(ctx, id)
	if err != nil {
		s.fail(w, r, err, "payoutId", id)
		return
	}
	httpjson.WriteJSON(w, http.StatusOK, p)
}

func (s *Service) handleClaim(w http.ResponseWriter, r *http.Request) {
	id, token, owner, ok := s.holder(w, r)
	if !ok {
		return
	}
	if err := decodeEmpty(w, r); err != nil {
		s.fail(w, r, err, "payoutId", id, "token", token, "ownerId", owner)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	p, err := s.claim(ctx, id, token, owner)
	if err != nil {
		s.fail(w, r, err, "payoutId", id, "token", token, "ownerId", owner)
		return
	}
	httpjson.WriteJSON(w, http.StatusOK, p)
}

func (s *Service) handleResult(w http.ResponseWriter, r *http.Request) {
	id, token, owner, ok := s.holder(w, r)
	if !ok {
		return
	}
	var req ResultRequest
	if err := httpjson.Decode(w, r, &req, MaxBodyBytes); err != nil {
		s.fail(w, r, err, "payoutId", id, "token", token, "ownerId", owner)
		return
	}
	if err := validateResult(req, token); err != nil {
		s.fail(w, r, err, "payoutId", id, "token", token, "ownerId", owner)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	p, err := s.result(ctx, id, token, owner, req)
	if err != nil {
		s.fail(w, r, err, "payoutId", id, "token", token, "ownerId", owner, "outcome", string(req.Outcome), "railRef", req.RailRef)
		return
	}
	httpjson.WriteJSON(w, http.StatusOK, p)
}

func (s *Service) handleAudit(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
	defer cancel()
	rep, err := Audit(ctx, s.pool)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !rep.Balanced {
		s.log.Warn("ledger audit found violations", "event", "audit_unbalanced", "violations", len(rep.Violations))
	}
	httpjson.WriteJSON(w, http.StatusOK, rep)
}

// holder reads the payout id of the path and the lock holder's token and
// owner headers; it answers the error itself and returns ok=false when one
// is invalid.
func (s *Service) holder(w http.ResponseWriter, r *http.Request) (id string, token int64, owner string, ok bool) {
	id, owner = r.PathValue("id"), fencing.OwnerFrom(r)
	if err := validID("payout id", id, MaxPayoutIDLen); err != nil {
		s.fail(w, r, err, "ownerId", owner)
		return "", 0, "", false
	}
	token, err := fencing.TokenFrom(r)
	if err != nil {
		s.fail(w, r, err, "payoutId", id, "ownerId", owner)
		return "", 0, "", false
	}
	return id, token, owner, true
}

// decodeEmpty accepts an empty body or an empty JSON object (the claim
// takes no parameters) and refuses anything else like httpjson.Decode.
func decodeEmpty(w http.ResponseWriter, r *http.Request) error {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return &httpjson.Error{Status: http.StatusRequestEntityTooLarge, Code: httpjson.CodeBodyTooLarge,
			Message: fmt.Sprintf("body larger than %d bytes", MaxBodyBytes)}
	case err != nil:
		return &httpjson.Error{Status: http.StatusBadRequest, Code: httpjson.CodeInvalidRequest, Message: "reading body: " + err.Error()}
	case len(bytes.TrimSpace(b)) == 0:
		return nil
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	return httpjson.Decode(w, r, &struct{}{}, MaxBodyBytes)
}

func createdStatus(created bool) int {
	if created {
		return http.StatusCreated
	}
	return http.StatusOK
}

// fail answers err with the error envelope and logs the refusal (5xx at
// ERROR; fenced_out has already been logged at WARN by the fence point).
func (s *Service) fail(w http.ResponseWriter, r *http.Request, err error, attrs ...any) {
	status, code, retryable := statusOf(err)
	attrs = append([]any{"status", status, "code", code, "method", r.Method, "path", r.URL.Path, "error", err.Error()}, attrs...)
	switch {
	case status >= 500:
		s.log.Error("request failed", append([]any{"event", "request_failed"}, attrs...)...)
	case code == CodeFencedOut:
		s.log.Debug("request refused", append([]any{"event", "request_refused"}, attrs...)...)
	default:
		s.log.Info("request refused", append([]any{"event", "request_refused"}, attrs...)...)
	}
	httpjson.WriteError(w, status, code, err.Error(), retryable)
}

// statusOf maps an error to its HTTP status, stable code and retryability:
// the one place where errors become HTTP answers.
func statusOf(err error) (status int, code string, retryable bool) {
	var decodeErr *httpjson.Error
	switch {
	case errors.As(err, &decodeErr):
		return decodeErr.Status, decodeErr.Code, false
	case errors.Is(err, fencing.ErrMissingToken), errors.Is(err, fencing.ErrBadToken):
		return http.StatusBadRequest, CodeInvalidToken, false
	case errors.Is(err, ErrInvalidArgument):
		return http.StatusBadRequest, CodeInvalidRequest, false
	case errors.Is(err, errNoRoute):
		return http.StatusNotFound, CodeNotFound, false
	case errors.Is(err, errMethodNotAllowed):
		return http.StatusMethodNotAllowed, CodeMethodNotAllowed, false
	case errors.Is(err, ErrAccountNotFound):
		return http.StatusNotFound, CodeAccountNotFound, false
	case errors.Is(err, ErrAccountConflict):
		return http.StatusConflict, CodeAccountConflict, false
	case errors.Is(err, ErrCurrencyMismatch):
		return http.StatusUnprocessableEntity, CodeCurrencyMismatch, false
	case errors.Is(err, ErrPayoutNotFound):
		return http.StatusNotFound, CodePayoutNotFound, false
	case errors.Is(err, ErrPayoutConflict):
		return http.StatusConflict, CodePayoutConflict, false
	case errors.Is(err, ErrFencedOut):
		return http.StatusConflict, CodeFencedOut, false
	case errors.Is(err, ErrPayoutFinished):
		return http.StatusConflict, CodePayoutFinished, false
	case errors.Is(err, ErrPayoutInDoubt):
		return http.StatusConflict, CodePayoutInDoubt, false
	case errors.Is(err, ErrPayoutNotClaimed):
		return http.StatusConflict, CodePayoutNotClaimed, false
	case errors.Is(err, ErrRailRefConflict):
		return http.StatusConflict, CodeRailRefConflict, false
	case errors.Is(err, ErrUnavailable), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return http.StatusServiceUnavailable, CodeUnavailable, true
	default:
		return http.StatusInternalServerError, CodeInternal, false
	}
}

// validID checks an account or payout id (payoutevent.ValidateID).
func validID(what, v string, max int) error {
	if err := payoutevent.ValidateID(what, v, max); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	return nil
}

func validCurrency(v string) error {
	if len(v) != 3 || !isUpper(v[0]) || !isUpper(v[1]) || !isUpper(v[2]) {
		return fmt.Errorf("%w: currency %q is not an ISO 4217 code (three upper-case letters)", ErrInvalidArgument, v)
	}
	return nil
}

func isUpper(c byte) bool { return 'A' <= c && c <= 'Z' }

func validateAccount(req AccountRequest) error {
	if err := validID("accountId", req.AccountID, MaxAccountIDLen); err != nil {
		return err
	}
	if err := validCurrency(req.Currency); err != nil {
		return err
	}
	switch {
	case req.OpeningBalanceMinor == nil:
		return fmt.Errorf("%w: openingBalanceMinor is required", ErrInvalidArgument)
	case *req.OpeningBalanceMinor < 0 || *req.OpeningBalanceMinor > MaxAmountMinor:
		return fmt.Errorf("%w: openingBalanceMinor %d is outside 0..%d", ErrInvalidArgument, *req.OpeningBalanceMinor, MaxAmountMinor)
	}
	return nil
}

func validatePayout(req PayoutRequest) error {
	if err := validID("payoutId", req.PayoutID, MaxPayoutIDLen); err != nil {
		return err
	}
	if err := validID("accountId", req.AccountID, MaxAccountIDLen); err != nil {
		return err
	}
	if err := validCurrency(req.Currency); err != nil {
		return err
	}
	if req.AmountMinor <= 0 || req.AmountMinor > MaxAmountMinor {
		return fmt.Errorf("%w: amountMinor %d is outside 1..%d", ErrInvalidArgument, req.AmountMinor, MaxAmountMinor)
	}
	return nil
}

func validateResult(req ResultRequest, token int64) error {
	if req.RailToken < 0 || req.RailToken > token {
		return fmt.Errorf("%w: railToken %d is outside 1..%d (the reporter's token)", ErrInvalidArgument, req.RailToken, token)
	}
	switch req.Outcome {
	case OutcomeAck, OutcomeDecline:
		if req.RailRef == "" {
			return fmt.Errorf("%w: railRef is required for %s", ErrInvalidArgument, req.Outcome)
		}
	case OutcomeAmbiguous:
	default:
		return fmt.Errorf("%w: outcome %q is not ACK, DECLINE or AMBIGUOUS", ErrInvalidArgument, req.Outcome)
	}
	if len(req.RailRef) > MaxRailRefLen {
		return fmt.Errorf("%w: railRef is %d bytes, longer than %d", ErrInvalidArgument, len(req.RailRef), MaxRailRefLen)
	}
	for i := 0; i < len(req.RailRef); i++ {
		if c := req.RailRef[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("%w: railRef has byte %q at offset %d; allowed: printable ASCII without spaces", ErrInvalidArgument, c, i)
		}
	}
	return nil
}
