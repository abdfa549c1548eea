package explore

// The adversarial holder's faults: forged terms (FaultForge), the resend
// (FaultResend) and the permanent refusal (FaultReject).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/fenceproof"
)

// headerResend marks a resend (FaultResend), headerForged a forged
// submission, for the explorer's own handler in front of rail-proxy.
const (
	headerResend = "X-Explore-Resend"
	headerForged = "X-Explore-Forged"
)

// sentRequest is a submission as it was sent, to be sent again.
type sentRequest struct {
	url    string
	header http.Header
	body   []byte
}

// keep copies req (and puts its body back).
func keep(req *http.Request) (*sentRequest, error) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	return &sentRequest{url: req.URL.String(), header: req.Header.Clone(), body: body}, nil
}

// sent reports whether the holder has sent a submission.
func (d *doer) sent() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.last != nil
}

// rejected is the answer to a submission refused for good (FaultReject):
// rail-proxy's 400 INVALID_REQUEST, not retryable; nothing recorded.
func rejected() *http.Response {
	w := httptest.NewRecorder()
	jsonhandler.WriteJSON(w, http.StatusBadRequest, railapi.ErrorEnvelope{Error: railapi.ErrorBody{Code: railapi.CodeInvalidRequest,
		Message: "explore: refused for good (FaultReject); nothing recorded"}})
	return w.Result()
}

// forger is the adversary's own key: a well-formed Ed25519 key that
// payment-resource never held.
var forger = func() fenceproof.SigningKey {
	k, err := fenceproof.GenerateSigningKey("explore-forger", rand.NewChaCha8([32]byte{'f', 'o', 'r', 'g', 'e'}))
	if err != nil {
		panic(err)
	}
	return k
}()

// decoy is a payout of another account, created once per Explorer, whose
// genuine signature a forgery borrows.
type decoy struct {
	terms     fencewire.PayoutTerms
	signature string
}

// newDecoy creates the decoy payout through payment-resource and reads
// its signature.
func (e *Explorer) newDecoy(ctx context.Context) (decoy, error) {
	ev := payoutevent.Event{PayoutID: "decoy-1", AccountID: "acct-decoy", AmountMinor: 777_00, Currency: "EUR"}
	if err := e.p.CreatePayout(ctx, ev); err != nil {
		return decoy{}, err
	}
	p, err := e.p.Pay.Payout(ctx, ev.PayoutID)
	if err != nil {
		return decoy{}, err
	}
	return decoy{terms: fencewire.PayoutTerms(ev), signature: p.TermsSignature}, nil
}

// forgery is one way to alter a submission's terms.
type forgery struct {
	name  string
	alter func(body map[string]any, genuine railapi.SubmitRequest, d decoy)
}

// forgeries: what a holder with a real lease might send instead of its
// payout's terms. Each keeps the holder's token, proof and owner.
var forgeries = []forgery{
	{"another amount under the payout's own signature", func(b map[string]any, g railapi.SubmitRequest, _ decoy) {
		b["amountMinor"] = g.AmountMinor + 1
	}},
	{"another account under the payout's own signature", func(b map[string]any, g railapi.SubmitRequest, _ decoy) {
		b["accountId"] = g.AccountID + "-x"
	}},
	{"another payout's signature with that payout's amount", func(b map[string]any, _ railapi.SubmitRequest, d decoy) {
		b["amountMinor"], b["termsSignature"] = d.terms.AmountMinor, d.signature
	}},
	{"a signature over the payout with another amount, by a key not payment-resource's", func(b map[string]any, g railapi.SubmitRequest, _ decoy) {
		t := g.Terms()
		t.AmountMinor *= 10
		b["amountMinor"], b["termsSignature"] = t.AmountMinor, forger.Sign(fencewire.PayoutTermsDomain, t.Fields()...)
	}},
}

// forge sends each forgery of req (a holder's submission, not sent yet)
// to rail-proxy with the holder's headers, and records a verdict per
// forgery: refused 403, with raildb unchanged (no attempt, no high-water
// mark) for the payout, its account and the forged account.
func (r *run) forge(req *http.Request) error {
	ctx := req.Context()
	genuine, err := keep(req)
	if err != nil {
		return err
	}
	var g railapi.SubmitRequest
	if err := json.Unmarshal(genuine.body, &g); err != nil {
		return fmt.Errorf("explore: forge: read the submission: %w", err)
	}
	r.forging.Store(true)
	defer r.forging.Store(false)
	accounts := []string{g.AccountID, g.AccountID + "-x", r.e.decoy.terms.AccountID}
	for _, f := range forgeries {
		var body map[string]any
		if err := json.Unmarshal(genuine.body, &body); err != nil {
			return err
		}
		f.alter(body, g, r.e.decoy)
		// A forged signature travels where the executor sends the real
		// one: in its header (a body member that differs from the
		// header is refused 400 before the terms are checked).
		sig, forgedSig := body["termsSignature"].(string)
		delete(body, "termsSignature")
		raw, err := json.Marshal(body)
		if err != nil {
			return err
		}
		before, err := r.railRecords(ctx, g.PayoutID, accounts)
		if err != nil {
			return err
		}
		freq, err := http.NewRequestWithContext(ctx, http.MethodPost, genuine.url, bytes.NewReader(raw))
		if err != nil {
			return err
		}
		freq.Header = genuine.header.Clone()
		freq.Header.Set(headerForged, "1")
		if forgedSig {
			freq.Header.Set(railapi.HeaderTermsSignature, sig)
		}
		resp, err := http.DefaultClient.Do(freq)
		if err != nil {
			return fmt.Errorf("explore: forge: %w", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		after, err := r.railRecords(ctx, g.PayoutID, accounts)
		if err != nil {
			return err
		}
		verdict := ""
		switch {
		case resp.StatusCode != http.StatusForbidden:
			verdict = fmt.Sprintf("forged submission (%s) answered %d, not 403", f.name, resp.StatusCode)
		case before != after:
			verdict = fmt.Sprintf("forged submission (%s) refused, yet raildb changed: %s, then %s", f.name, before, after)
		}
		r.seen.mu.Lock()
		r.seen.forgery = append(r.seen.forgery, verdict)
		r.seen.mu.Unlock()
	}
	return nil
}

// railRecords summarises what raildb holds for payout and accounts: the
// number of attempts, the payout's forward and the high-water marks.
func (r *run) railRecords(ctx context.Context, payout string, accounts []string) (string, error) {
	var attempts int64
	var forward, marks string
	err := r.e.p.RailDB.QueryRow(ctx, `SELECT
 (SELECT count(*) FROM rail_attempt WHERE payout_id = $1 OR account_id = ANY($2)),
 (SELECT COALESCE(string_agg(attempt_id::text, ','), '') FROM rail_payout WHERE payout_id = $1),
 (SELECT COALESCE(string_agg(account_id || '=' || high_water, ',' ORDER BY account_id), '') FROM rail_high_water WHERE account_id = ANY($2))`,
		payout, accounts).Scan(&attempts, &forward, &marks)
	return fmt.Sprintf("%d attempts, forward [%s], high-water [%s]", attempts, forward, marks), err
}

// resend sends a copy of holder h's last submission to rail-proxy, on
// runCtx, and waits until rail-proxy has either answered it or called
// the rail with it; that call is returned, held, as rail-proxy's pending
// step (nil when there is none).
func (r *run) resend(ctx, runCtx context.Context, h int) (*arrival, error) {
	d := r.doers[h]
	d.mu.Lock()
	last := d.last
	d.mu.Unlock()
	req, err := http.NewRequestWithContext(runCtx, http.MethodPost, last.url, bytes.NewReader(last.body))
	if err != nil {
		return nil, err
	}
	req.Header = last.header.Clone()
	req.Header.Set(headerResend, "1")
	r.running.Store(railProxyIndex)
	defer r.running.Store(-1)
	r.detachedResend.Store(true)
	r.detached.Store(int32(h))
	r.bg.Go(func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
	select {
	case a := <-r.arrive:
		if a.holder != railProxyIndex || a.step != StepRail {
			return nil, fmt.Errorf("explore: %s arrived at %s during %s's resend", holderName(a.holder), a.step, holderName(h))
		}
		return &a, nil
	case <-r.proxyDone:
		r.detachedResend.Store(false)
		return nil, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
