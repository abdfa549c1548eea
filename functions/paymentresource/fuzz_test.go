package paymentresource_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/fuzztest"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Operations of a fuzz input (op % 8). Above 127, the method is picked
// from fuzztest.Methods instead of the operation's own.
const (
	opCreateAccount = iota
	opGetAccount
	opCreatePayout
	opGetPayout
	opClaim
	opResult
	opAudit
	opRawPath // id is the whole path
)

// Proof modes of a fuzz input (proofMode % 4): what X-Fencing-Proof holds.
const (
	proofNone    = iota // no header
	proofValid          // lock-server's proof of the token on the payout's account
	proofGarbage        // the input's proofArg, as sent
	proofOther          // lock-server's proof of the token on another account
)

// fuzzReceipt is rail-proxy's genuine receipt for payout p-2 (claimed
// with token 5 on acct-1) answered ACK as rail-000001.
func fuzzReceipt() string {
	return fencingtest.Receipt(fencewire.RailReceipt{PayoutID: "p-2", AccountID: "acct-1", AmountMinor: 2500,
		Currency: "EUR", Outcome: string(api.OutcomeAck), RailRef: "rail-000001", RailToken: 5})
}

// FuzzPaymentResource sends one request (create or read an account or a
// payout, claim, result, audit, or any path) with an arbitrary id, method,
// fencing token, proof (none, valid, garbage, another account's), owner,
// content type and body to payment-resource over one paydb, and checks the
// answer's properties (package fuzztest), that a refusal changed no row,
// and that no claim or result passes without a valid proof.
func FuzzPaymentResource(f *testing.F) {
	dsn := pgtest.NewDatabase(f)
	cfg := paymentresource.DefaultConfig()
	cfg.DatabaseURL, cfg.OutboxPoll = dsn, 10*time.Millisecond
	cfg.ProofKeys, cfg.ReceiptKeys = fencingtest.ProofKeys(), fencingtest.ReceiptKeys()
	cfg.TermsKey = fencingtest.TermsSigningKey()
	svc, err := paymentresource.New(context.Background(), cfg, newPublisher(nil), slog.New(slog.DiscardHandler))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(svc.Close)
	h := svc.Handler()
	db, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(db.Close)
	send := func(method, path, body string, headers ...string) {
		req, _ := fuzztest.NewRequest(0, path, []byte(body), append([]string{"Content-Type", "application/json"}, headers...)...)
		req.Method = method
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 300 {
			f.Fatalf("setup %s %s: %d %s", method, path, rec.Code, rec.Body)
		}
	}
	// acct-1 holds 100.00 EUR; p-1 is pending, p-2 claimed with token 5.
	send("POST", api.PathAccounts, `{"accountId":"acct-1","currency":"EUR","openingBalanceMinor":10000}`)
	send("POST", api.PathPayouts, `{"payoutId":"p-1","accountId":"acct-1","amountMinor":2500,"currency":"EUR"}`)
	send("POST", api.PathPayouts, `{"payoutId":"p-2","accountId":"acct-1","amountMinor":2500,"currency":"EUR"}`)
	send("POST", api.ClaimPath("p-2"), ``, api.HeaderToken, "5", api.HeaderProof, fencingtest.Proof("acct-1", 5), api.HeaderOwner, "worker-a")

	const ct = "application/json"
	ack := fmt.Sprintf(`{"outcome":"ACK","railRef":"rail-000001","railToken":5,"receipt":%q}`, fuzzReceipt())
	for _, s := range []struct {
		op                        uint8
		id, token                 string
		proofMode                 uint8
		proofArg, owner, ct, body string
	}{
		{opCreateAccount, "", "", proofNone, "", "", ct, `{"accountId":"acct-2","currency":"USD","openingBalanceMinor":500}`},
		{opCreateAccount, "", "", proofNone, "", "", ct, `{"accountId":"acct-1","currency":"USD","openingBalanceMinor":500}`},
		{opCreateAccount, "", "", proofNone, "", "", ct, `{"accountId":"acct-3","currency":"eur","openingBalanceMinor":500}`},
		{opCreateAccount, "", "", proofNone, "", "", ct, `{"accountId":"acct-3","currency":"EUR","openingBalanceMinor":-1}`},
		{opCreateAccount, "", "", proofNone, "", "", ct, `{"accountId":"acct-3","currency":"EUR"}`},
		{opCreateAccount, "", "", proofNone, "", "", ct, `{"accountId":"acct-3","currency":"EUR","openingBalanceMinor":1e30}`},
		{opCreateAccount, "", "", proofNone, "", "", "text/plain", `{"accountId":"acct-3","currency":"EUR","openingBalanceMinor":1}`},
		{opGetAccount, "acct-1", "", proofNone, "", "", "", ``},
		{opGetAccount, "acct-404", "", proofNone, "", "", "", ``},
		{opGetAccount, "acct 1", "", proofNone, "", "", "", ``},
		{opCreatePayout, "", "", proofNone, "", "", ct, `{"payoutId":"p-3","accountId":"acct-1","amountMinor":100,"currency":"EUR"}`},
		{opCreatePayout, "", "", proofNone, "", "", ct, `{"payoutId":"p-1","accountId":"acct-1","amountMinor":999,"currency":"EUR"}`},
		{opCreatePayout, "", "", proofNone, "", "", ct, `{"payoutId":"p-4","accountId":"acct-1","amountMinor":100,"currency":"USD"}`},
		{opCreatePayout, "", "", proofNone, "", "", ct, `{"payoutId":"p-4","accountId":"acct-404","amountMinor":100,"currency":"EUR"}`},
		{opCreatePayout, "", "", proofNone, "", "", ct, `{"payoutId":"p-4","accountId":"acct-1","amountMinor":0,"currency":"EUR"}`},
		{opGetPayout, "p-2", "", proofNone, "", "", "", ``},
		{opClaim, "p-1", "6", proofValid, "", "worker-b", "", ``},
		{opClaim, "p-1", "6", proofValid, "", "worker-b", ct, `{}`},
		{opClaim, "p-1", "7", proofNone, "", "worker-b", "", ``},
		{opClaim, "p-1", "9223372036854775807", proofGarbage, "v1.1.test-lock.AAAA", "", "", ``},
		{opClaim, "p-1", "8", proofOther, "", "", "", ``},
		{opClaim, "p-1", "", proofNone, "", "", "", ``},
		{opClaim, "p-1", "0", proofValid, "", "", "", ``},
		{opClaim, "p-1", "abc", proofValid, "", "", "", ``},
		{opClaim, "p-404", "9", proofValid, "", "", "", ``},
		{opClaim, "p-2", "4", proofValid, "", "", "", ``},
		{opClaim, "p-1", "10", proofValid, "", "", ct, `{"x":1}`},
		{opClaim, "p-1", "11", proofValid, "", "w\xff", "", ``},
		{opResult, "p-2", "5", proofValid, "", "worker-a", ct, ack},
		{opResult, "p-2", "5", proofValid, "", "worker-a", ct, `{"outcome":"ACK","railRef":"rail-000009","railToken":5,"receipt":"test-rail.AAAA"}`},
		{opResult, "p-2", "5", proofValid, "", "worker-a", ct, `{"outcome":"ACK","railRef":"rail-000009","railToken":5}`},
		{opResult, "p-2", "5", proofValid, "", "worker-a", ct, `{"outcome":"AMBIGUOUS"}`},
		{opResult, "p-2", "5", proofValid, "", "worker-a", ct, `{"outcome":"MAYBE"}`},
		{opResult, "p-2", "5", proofNone, "", "worker-a", ct, ack},
		{opResult, "p-1", "5", proofValid, "", "worker-a", ct, ack},
		{opAudit, "", "", proofNone, "", "", "", ``},
		{opRawPath, "/v1/nope", "", proofNone, "", "", "", ``},
		{opRawPath, "/v1/payouts/p-1/claim/x", "", proofNone, "", "", "", ``},
		{opRawPath, "/v1/audit?full=1", "", proofNone, "", "", "", ``},
		{opRawPath, "/v1/payouts?state=pending&x=%zz", "", proofNone, "", "", "", ``},
		{opClaim + 128, "p-1", "12", proofValid, "", "", "", ``},
	} {
		f.Add(s.op, s.id, s.token, s.proofMode, s.proofArg, s.owner, s.ct, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, op uint8, id, token string, proofMode uint8, proofArg, owner, contentType string, body []byte) {
		var method, path string
		switch op % 8 {
		case opCreateAccount:
			method, path = http.MethodPost, api.PathAccounts
		case opGetAccount:
			method, path = http.MethodGet, api.AccountPath(id)
		case opCreatePayout:
			method, path = http.MethodPost, api.PathPayouts
		case opGetPayout:
			method, path = http.MethodGet, api.PayoutPath(id)
		case opClaim:
			method, path = http.MethodPost, api.ClaimPath(id)
		case opResult:
			method, path = http.MethodPost, api.ResultPath(id)
		case opAudit:
			method, path = http.MethodGet, api.PathAudit
		case opRawPath:
			method, path = http.MethodPost, id
		}
		if !fuzztest.Canonical(path) {
			return // refused by the server constructor first
		}
		ctx := context.Background()
		var proof string
		switch proofMode % 4 {
		case proofValid, proofOther:
			var account string
			_ = db.QueryRow(ctx, `SELECT account_id FROM payout WHERE payout_id = $1`, id).Scan(&account)
			if proofMode%4 == proofOther {
				account += "-other"
			}
			var tok int64
			_, _ = fmt.Sscan(token, &tok)
			proof = fencingtest.Proof(account, tok)
		case proofGarbage:
			proof = proofArg
		}
		req, ok := fuzztest.NewRequest(0, path, body, "Content-Type", contentType,
			api.HeaderToken, token, api.HeaderProof, proof, api.HeaderOwner, owner)
		if !ok {
			return
		}
		req.Method = method
		if op >= 128 {
			req.Method = fuzztest.Methods[int(op)%len(fuzztest.Methods)]
		}
		before, err := fuzztest.Snapshot(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		a := fuzztest.FromRecorder(rec)
		if err := fuzztest.Check(a, fuzztest.Options{}, id, token, proof, owner, contentType, string(body)); err != nil {
			t.Fatalf("%s %q token %q proof %q owner %q: %v", req.Method, path, token, proof, owner, err)
		}
		after, err := fuzztest.Snapshot(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		if a.Status >= 400 {
			if changed := before.Changed(after); len(changed) > 0 {
				env, _ := fuzztest.DecodeEnvelope(a.Body, false)
				t.Fatalf("refused %s %q (%d %s) changed tables %v", req.Method, path, a.Status, env.Error.Code, changed)
			}
			return
		}
		if (op%8 == opClaim || op%8 == opResult) && req.Method == http.MethodPost && proofMode%4 != proofValid {
			t.Fatalf("%s %q with proof %q (mode %d) was accepted: %d %s", req.Method, path, proof, proofMode%4, a.Status, a.Body)
		}
	})
}
