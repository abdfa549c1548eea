package badinput_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource"
	payapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/reconciler"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/fuzztest"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	lockapi "github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

var update = flag.Bool("update", false, "rewrite the bad-input table in docs/reliability.md")

func TestMain(m *testing.M) { pgtest.Main(m) }

// The table's place in the document.
const (
	docPath     = "../../docs/reliability.md"
	markerStart = "<!-- bad-input-table:start -->"
	markerEnd   = "<!-- bad-input-table:end -->"
)

// Services, as the table names them.
const (
	svcLock    = "lock-server"
	svcPay     = "payment-resource"
	svcProxy   = "rail-proxy"
	svcStub    = "rail-stub"
	svcPush    = "executor (push)"
	svcRecon   = "reconciler"
	ctJSON     = "application/json"
	codeNone   = "" // an answer without an envelope (the push endpoint's 204 and 200)
	acct       = "acct-1"
	tokenGood  = int64(5)
	tokenLimit = "9223372036854775807"
)

// row is one bad input and the answer it must get.
type row struct {
	service, name string
	method, path  string
	headers       []string // name, value pairs
	body          string
	status        int
	code          string
	// allowed lists the tables the refusal may change (the audit row of
	// FENCED_OUT at rail-proxy); any other change fails the row.
	allowed []string
}

// world is one of each service, wired as the local stack wires them.
type world struct {
	handlers map[string]http.Handler
	dbs      map[string]*pgxpool.Pool
	stub     *railstub.Stub
	lockKeys *memstore.Store
}

func newWorld(t *testing.T) *world {
	t.Helper()
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	w := &world{handlers: map[string]http.Handler{}, dbs: map[string]*pgxpool.Pool{}}

	w.lockKeys = memstore.New(nil)
	lcfg := lockserver.DefaultServerConfig()
	lcfg.ProofKey = fencingtest.LockSigningKey()
	ls, err := lockserver.NewServer(w.lockKeys, lcfg, log)
	if err != nil {
		t.Fatal(err)
	}
	w.handlers[svcLock] = ls

	stub, err := railstub.New(railstub.DefaultConfig(), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stub.Close() })
	w.stub, w.handlers[svcStub] = stub, stub
	rail := httptest.NewServer(stub)
	t.Cleanup(rail.Close)

	pool := func(dsn string) *pgxpool.Pool {
		p, err := pgxpool.New(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p
	}
	rdsn := pgtest.NewDatabase(t)
	rcfg := railproxy.DefaultConfig()
	rcfg.DB.DSN, rcfg.RailURL = rdsn, rail.URL
	rcfg.ProofKeys, rcfg.ReceiptKey = fencingtest.ProofKeys(), fencingtest.ReceiptSigningKey()
	rcfg.TermsKeys = fencingtest.TermsKeys()
	proxy, err := railproxy.New(ctx, rcfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	w.handlers[svcProxy], w.dbs[svcProxy] = proxy, pool(rdsn)

	pdsn := pgtest.NewDatabase(t)
	pcfg := paymentresource.DefaultConfig()
	pcfg.DatabaseURL, pcfg.OutboxPoll = pdsn, 10*time.Millisecond
	pcfg.ProofKeys, pcfg.ReceiptKeys = fencingtest.ProofKeys(), fencingtest.ReceiptKeys()
	pcfg.TermsKey = fencingtest.TermsSigningKey()
	svc, err := paymentresource.New(ctx, pcfg, publisher{}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	w.handlers[svcPay], w.dbs[svcPay] = svc.Handler(), pool(pdsn)

	serve := func(h http.Handler) string {
		s := httptest.NewServer(h)
		t.Cleanup(s.Close)
		return s.URL
	}
	lockURL, payURL, proxyURL := serve(ls), serve(svc.Handler()), serve(proxy)
	xcfg := executor.DefaultConfig()
	xcfg.LockServerURL, xcfg.PaymentResourceURL, xcfg.RailProxyURL = lockURL, payURL, proxyURL
	xcfg.Owner = "worker-a"
	x, err := executor.New(xcfg, log)
	if err != nil {
		t.Fatal(err)
	}
	// Its lease releases follow the push answers: wait for the last ones.
	t.Cleanup(func() { _ = x.Close(context.Background()) })
	w.handlers[svcPush] = x
	ccfg := reconciler.DefaultConfig()
	ccfg.LockServerURL, ccfg.PaymentResourceURL, ccfg.RailProxyURL = lockURL, payURL, proxyURL
	rec, err := reconciler.New(ccfg, log)
	if err != nil {
		t.Fatal(err)
	}
	w.handlers[svcRecon] = rec
	return w
}

// publisher accepts every outbox message.
type publisher struct{}

func (publisher) Publish(context.Context, string, []byte, map[string]string) error { return nil }

// send answers r with the service's handler.
func (w *world) send(r row) *httptest.ResponseRecorder {
	req, ok := fuzztest.NewRequest(0, r.path, []byte(r.body), r.headers...)
	if !ok {
		panic("row " + r.name + " has a header net/http would refuse")
	}
	req.Method = r.method
	// A header a row names more than once is sent more than once
	// (NewRequest keeps the last).
	seen := map[string]int{}
	for i := 0; i+1 < len(r.headers); i += 2 {
		seen[http.CanonicalHeaderKey(r.headers[i])]++
	}
	for name, n := range seen {
		if n > 1 {
			req.Header.Del(name)
			for i := 0; i+1 < len(r.headers); i += 2 {
				if http.CanonicalHeaderKey(r.headers[i]) == name {
					req.Header.Add(name, r.headers[i+1])
				}
			}
		}
	}
	rec := httptest.NewRecorder()
	w.handlers[r.service].ServeHTTP(rec, req)
	return rec
}

// setup makes the state the rows refer to: acct-1 (EUR) with payouts p-1
// (pending) and p-2 (claimed with token 5); rail-proxy's high-water of
// acct-1 at 5; lock-server's payout:acct-1 held by worker-a (token 1).
func (w *world) setup(t *testing.T) {
	t.Helper()
	holder := []string{"Content-Type", ctJSON, payapi.HeaderToken, fmt.Sprint(tokenGood), payapi.HeaderProof, fencingtest.Proof(acct, tokenGood), payapi.HeaderOwner, "worker-a"}
	for _, r := range []row{
		{service: svcPay, method: "POST", path: payapi.PathAccounts, headers: []string{"Content-Type", ctJSON}, body: `{"accountId":"acct-1","currency":"EUR","openingBalanceMinor":10000}`},
		{service: svcPay, method: "POST", path: payapi.PathPayouts, headers: []string{"Content-Type", ctJSON}, body: `{"payoutId":"p-1","accountId":"acct-1","amountMinor":2500,"currency":"EUR"}`},
		{service: svcPay, method: "POST", path: payapi.PathPayouts, headers: []string{"Content-Type", ctJSON}, body: `{"payoutId":"p-2","accountId":"acct-1","amountMinor":2500,"currency":"EUR"}`},
		{service: svcPay, method: "POST", path: payapi.ClaimPath("p-2"), headers: holder},
		{service: svcProxy, method: "POST", path: railapi.PathSubmissions, headers: signedBy(holder, termsOf("p-2", "acct-1", 2500)), body: submission("p-2", "acct-1", 2500)},
		{service: svcLock, method: "POST", path: lockapi.PathLockPrefix + "payout:acct-1" + lockapi.SuffixAcquire, headers: []string{"Content-Type", ctJSON}, body: `{"owner":"worker-a","ttlMs":600000}`},
	} {
		if rec := w.send(r); rec.Code >= 300 {
			t.Fatalf("setup %s %s: %d %s", r.method, r.path, rec.Code, rec.Body)
		}
	}
}

// termsOf is payment-resource's signature (the test key) over a payout's
// terms, in EUR.
func termsOf(payout, account string, amount int64) string {
	return fencingtest.Terms(fencewire.PayoutTerms{PayoutID: payout, AccountID: account, AmountMinor: amount, Currency: "EUR"})
}

// submission is rail-proxy's body for a payout in EUR; its terms
// signature travels in a header (signedBy).
func submission(payout, account string, amount int64) string {
	b, _ := json.Marshal(railapi.SubmitRequest{PayoutID: payout, AccountID: account, AmountMinor: amount, Currency: "EUR"})
	return string(b)
}

// signedBy is headers with the terms signature sig in
// railapi.HeaderTermsSignature ("" for none).
func signedBy(headers []string, sig string) []string {
	if sig == "" {
		return headers
	}
	return append(slices.Clone(headers), railapi.HeaderTermsSignature, sig)
}

// rows returns the table: every named bad input and its answer.
func rows() []row {
	js := []string{"Content-Type", ctJSON}
	twice := []string{"Content-Type", ctJSON, "Content-Type", ctJSON}
	with := func(h ...string) []string { return append(slices.Clone(js), h...) }
	holder := func(token, proof string) []string {
		h := with(payapi.HeaderToken, token, payapi.HeaderOwner, "worker-b")
		if proof != "" {
			h = append(h, payapi.HeaderProof, proof)
		}
		return h
	}
	proof := func(account string, token int64) string { return fencingtest.Proof(account, token) }
	lock := func(op string) string { return lockapi.PathLockPrefix + "payout:acct-1" + op }
	sub := submission("p-1", "acct-1", 2500)
	p1 := func(h []string) []string { return signedBy(h, termsOf("p-1", "acct-1", 2500)) } // p-1 as payment-resource signs it
	stubOK := `{"payoutId":"p-1","accountId":"acct-1","amountMinor":2500,"currency":"EUR","reference":"p-1"}`
	push := func(data string) string {
		b, _ := payoutevent.EncodeRaw([]byte(data), nil, "m-1", acct, 1)
		return string(b)
	}
	return []row{
		// lock-server
		{svcLock, "malformed JSON", "POST", lockapi.PathLockPrefix + "k" + lockapi.SuffixAcquire, js, `{"owner":`, 400, string(lockapi.CodeInvalidRequest), nil},
		{svcLock, "unknown field", "POST", lockapi.PathLockPrefix + "k" + lockapi.SuffixAcquire, js, `{"owner":"w","ttlMs":1000,"priority":1}`, 400, string(lockapi.CodeInvalidRequest), nil},
		{svcLock, "field given twice", "POST", lockapi.PathLockPrefix + "k" + lockapi.SuffixAcquire, js, `{"owner":"w","owner":"x","ttlMs":1000}`, 400, string(lockapi.CodeInvalidRequest), nil},
		{svcLock, "data after the object", "POST", lockapi.PathLockPrefix + "k" + lockapi.SuffixAcquire, js, `{"owner":"w","ttlMs":1000} {}`, 400, string(lockapi.CodeInvalidRequest), nil},
		{svcLock, "TTL below the minimum", "POST", lockapi.PathLockPrefix + "k" + lockapi.SuffixAcquire, js, `{"owner":"w","ttlMs":1}`, 400, string(lockapi.CodeInvalidRequest), nil},
		{svcLock, "fractional TTL", "POST", lockapi.PathLockPrefix + "k" + lockapi.SuffixAcquire, js, `{"owner":"w","ttlMs":1000.5}`, 400, string(lockapi.CodeInvalidRequest), nil},
		{svcLock, "owner with a byte outside the rule", "POST", lockapi.PathLockPrefix + "k" + lockapi.SuffixAcquire, js, "{\"owner\":\"w\xff\",\"ttlMs\":1000}", 400, string(lockapi.CodeInvalidRequest), nil},
		{svcLock, "content type text/plain", "POST", lockapi.PathLockPrefix + "k" + lockapi.SuffixAcquire, []string{"Content-Type", "text/plain"}, `{"owner":"w","ttlMs":1000}`, 415, string(lockapi.CodeUnsupportedMediaType), nil},
		{svcLock, "content type with charset=latin1", "POST", lockapi.PathLockPrefix + "k" + lockapi.SuffixAcquire, []string{"Content-Type", "application/json; charset=latin1"}, `{"owner":"w","ttlMs":1000}`, 415, string(lockapi.CodeUnsupportedMediaType), nil},
		{svcLock, "no content type, with a body", "POST", lockapi.PathLockPrefix + "k" + lockapi.SuffixAcquire, nil, `{"owner":"w","ttlMs":1000}`, 415, string(lockapi.CodeUnsupportedMediaType), nil},
		{svcLock, "content type sent twice", "POST", lockapi.PathLockPrefix + "k" + lockapi.SuffixAcquire, twice, `{"owner":"w","ttlMs":1000}`, 400, string(lockapi.CodeInvalidRequest), nil},
		{svcLock, "revoke reason with an escaped lone surrogate", "POST", lock(lockapi.SuffixRevoke), js, `{"reason":"\udc00"}`, 400, string(lockapi.CodeInvalidRequest), nil},
		{svcLock, "request timeout header -1", "POST", lockapi.PathLockPrefix + "k" + lockapi.SuffixAcquire, with(lockapi.HeaderTimeoutMs, "-1"), `{"owner":"w","ttlMs":1000}`, 400, string(lockapi.CodeInvalidRequest), nil},
		{svcLock, "request timeout header 101, below the minimum", "POST", lockapi.PathLockPrefix + "k" + lockapi.SuffixAcquire, with(lockapi.HeaderTimeoutMs, "101"), `{"owner":"w","ttlMs":1000}`, 400, string(lockapi.CodeInvalidRequest), nil},
		{svcLock, "request timeout header of 20 digits", "POST", lockapi.PathLockPrefix + "k" + lockapi.SuffixAcquire, with(lockapi.HeaderTimeoutMs, "99999999999999999999"), `{"owner":"w","ttlMs":1000}`, 400, string(lockapi.CodeInvalidRequest), nil},
		{svcLock, "body over 4 KiB", "POST", lockapi.PathLockPrefix + "k" + lockapi.SuffixAcquire, js, `{"owner":"` + strings.Repeat("a", lockapi.MaxBodyBytes) + `","ttlMs":1000}`, 413, string(lockapi.CodeBodyTooLarge), nil},
		{svcLock, "key starting with '-'", "POST", lockapi.PathLockPrefix + "-bad" + lockapi.SuffixAcquire, js, `{"owner":"w","ttlMs":1000}`, 400, string(lockapi.CodeInvalidRequest), nil},
		{svcLock, "key over 128 bytes", "POST", lockapi.PathLockPrefix + strings.Repeat("k", lockapi.MaxKeyLen+1) + lockapi.SuffixAcquire, js, `{"owner":"w","ttlMs":1000}`, 400, string(lockapi.CodeInvalidRequest), nil},
		{svcLock, "'..' in the path", "POST", "/v1/locks/../acquire", js, `{"owner":"w","ttlMs":1000}`, 400, string(lockapi.CodeInvalidRequest), nil},
		{svcLock, "renew with token 0", "POST", lock(lockapi.SuffixRenew), js, `{"owner":"worker-a","token":0}`, 400, string(lockapi.CodeInvalidRequest), nil},
		{svcLock, "release by another owner", "POST", lock(lockapi.SuffixRelease), js, `{"owner":"mallory","token":1}`, 409, string(lockapi.CodeLeaseNotHeld), nil},
		{svcLock, "acquire of a held lock", "POST", lock(lockapi.SuffixAcquire), js, `{"owner":"worker-b","ttlMs":1000}`, 409, string(lockapi.CodeLockHeld), nil},
		{svcLock, "revoke reason over 256 bytes", "POST", lock(lockapi.SuffixRevoke), js, `{"reason":"` + strings.Repeat("r", lockapi.MaxReasonLen+1) + `"}`, 400, string(lockapi.CodeInvalidRequest), nil},
		{svcLock, "waitMs null", "POST", lockapi.PathLockPrefix + "k" + lockapi.SuffixAcquire, js, `{"owner":"w","ttlMs":1000,"waitMs":null}`, 400, string(lockapi.CodeInvalidRequest), nil},
		{svcLock, "revoke token null", "POST", lock(lockapi.SuffixRevoke), js, `{"token":null}`, 400, string(lockapi.CodeInvalidRequest), nil},
		{svcLock, "unknown operation", "POST", lock("/steal"), js, `{}`, 404, string(lockapi.CodeNotFound), nil},
		{svcLock, "query parameter on an acquire", "POST", lockapi.PathLockPrefix + "k" + lockapi.SuffixAcquire + "?waitMs=5000", js, `{"owner":"w","ttlMs":1000}`, 400, string(lockapi.CodeInvalidRequest), nil},
		{svcLock, "GET on an operation", "GET", lock(lockapi.SuffixRelease), nil, ``, 405, string(lockapi.CodeMethodNotAllowed), nil},

		// payment-resource
		{svcPay, "account: unknown field", "POST", payapi.PathAccounts, js, `{"accountId":"acct-9","currency":"EUR","openingBalanceMinor":1,"vip":true}`, 400, string(payapi.CodeInvalidRequest), nil},
		{svcPay, "account: lower-case currency", "POST", payapi.PathAccounts, js, `{"accountId":"acct-9","currency":"eur","openingBalanceMinor":1}`, 400, string(payapi.CodeInvalidRequest), nil},
		{svcPay, "account: negative opening balance", "POST", payapi.PathAccounts, js, `{"accountId":"acct-9","currency":"EUR","openingBalanceMinor":-1}`, 400, string(payapi.CodeInvalidRequest), nil},
		{svcPay, "account: id reused with another currency", "POST", payapi.PathAccounts, js, `{"accountId":"acct-1","currency":"USD","openingBalanceMinor":10000}`, 409, string(payapi.CodeAccountConflict), nil},
		{svcPay, "account: id with a space", "GET", "/v1/accounts/acct 1", nil, ``, 400, string(payapi.CodeInvalidRequest), nil},
		{svcPay, "payout: amount 0", "POST", payapi.PathPayouts, js, `{"payoutId":"p-9","accountId":"acct-1","amountMinor":0,"currency":"EUR"}`, 400, string(payapi.CodeInvalidRequest), nil},
		{svcPay, "payout: content type with charset=latin1", "POST", payapi.PathPayouts, []string{"Content-Type", "application/json; charset=latin1"}, `{"payoutId":"p-9","accountId":"acct-1","amountMinor":1,"currency":"EUR"}`, 415, string(payapi.CodeUnsupportedMediaType), nil},
		{svcPay, "payout: no content type, with a body", "POST", payapi.PathPayouts, nil, `{"payoutId":"p-9","accountId":"acct-1","amountMinor":1,"currency":"EUR"}`, 415, string(payapi.CodeUnsupportedMediaType), nil},
		{svcPay, "payout: content type sent twice", "POST", payapi.PathPayouts, []string{"Content-Type", ctJSON, "Content-Type", "text/plain"}, `{"payoutId":"p-9","accountId":"acct-1","amountMinor":1,"currency":"EUR"}`, 400, string(payapi.CodeInvalidRequest), nil},
		{svcPay, "account: no content type, with a body", "POST", payapi.PathAccounts, nil, `{"accountId":"acct-9","currency":"EUR","openingBalanceMinor":1}`, 415, string(payapi.CodeUnsupportedMediaType), nil},
		{svcPay, "claim: a body without content type", "POST", payapi.ClaimPath("p-1"), []string{payapi.HeaderToken, "6", payapi.HeaderProof, proof(acct, 6), payapi.HeaderOwner, "worker-b"}, `{}`, 415, string(payapi.CodeUnsupportedMediaType), nil},
		{svcPay, "payout: unknown account", "POST", payapi.PathPayouts, js, `{"payoutId":"p-9","accountId":"acct-404","amountMinor":1,"currency":"EUR"}`, 404, string(payapi.CodeAccountNotFound), nil},
		{svcPay, "payout: currency not the account's", "POST", payapi.PathPayouts, js, `{"payoutId":"p-9","accountId":"acct-1","amountMinor":1,"currency":"USD"}`, 422, string(payapi.CodeCurrencyMismatch), nil},
		{svcPay, "payout: amount above the available balance", "POST", payapi.PathPayouts, js, `{"payoutId":"p-9","accountId":"acct-1","amountMinor":5001,"currency":"EUR"}`, 409, string(payapi.CodeInsufficientFunds), nil},
		{svcPay, "payout: id reused with another amount", "POST", payapi.PathPayouts, js, `{"payoutId":"p-1","accountId":"acct-1","amountMinor":9999,"currency":"EUR"}`, 409, string(payapi.CodePayoutConflict), nil},
		{svcPay, "claim: no fencing token", "POST", payapi.ClaimPath("p-1"), with(payapi.HeaderOwner, "worker-b"), ``, 400, string(payapi.CodeInvalidToken), nil},
		{svcPay, "claim: token 0", "POST", payapi.ClaimPath("p-1"), holder("0", proof(acct, 0)), ``, 400, string(payapi.CodeInvalidToken), nil},
		{svcPay, "claim: token with a '+' sign", "POST", payapi.ClaimPath("p-1"), holder("+6", proof(acct, 6)), ``, 400, string(payapi.CodeInvalidToken), nil},
		{svcPay, "claim: token not a number", "POST", payapi.ClaimPath("p-1"), holder("six", ""), ``, 400, string(payapi.CodeInvalidToken), nil},
		{svcPay, "claim: no proof", "POST", payapi.ClaimPath("p-1"), holder("6", ""), ``, 403, string(payapi.CodeUnverifiedToken), nil},
		{svcPay, "claim: proof of another account's lock", "POST", payapi.ClaimPath("p-1"), holder("6", proof("acct-2", 6)), ``, 403, string(payapi.CodeUnverifiedToken), nil},
		{svcPay, "claim: forged maximum token, garbage proof", "POST", payapi.ClaimPath("p-1"), holder(tokenLimit, "v1.1.test-lock.AAAA"), ``, 403, string(payapi.CodeUnverifiedToken), nil},
		{svcPay, "claim: proof of another token", "POST", payapi.ClaimPath("p-1"), holder("7", proof(acct, 6)), ``, 403, string(payapi.CodeUnverifiedToken), nil},
		{svcPay, "claim: owner header not UTF-8", "POST", payapi.ClaimPath("p-1"), with(payapi.HeaderToken, "6", payapi.HeaderProof, proof(acct, 6), payapi.HeaderOwner, "w\xff"), ``, 400, string(payapi.CodeInvalidRequest), nil},
		{svcPay, "claim: a body", "POST", payapi.ClaimPath("p-1"), holder("6", proof(acct, 6)), `{"force":true}`, 400, string(payapi.CodeInvalidRequest), nil},
		{svcPay, "claim: terms of another account (a forged event), with that account's lock", "POST", payapi.ClaimPath("p-1"), holder("6", proof("acct-2", 6)), `{"accountId":"acct-2","amountMinor":2500,"currency":"EUR"}`, 409, string(payapi.CodePayoutTermsMismatch), nil},
		{svcPay, "claim: unknown payout", "POST", payapi.ClaimPath("p-404"), holder("6", proof(acct, 6)), ``, 404, string(payapi.CodePayoutNotFound), nil},
		{svcPay, "result: ACK without a receipt", "POST", payapi.ResultPath("p-2"), holder("5", proof(acct, 5)), `{"outcome":"ACK","railRef":"rail-000001","railToken":5}`, 422, string(payapi.CodeInvalidReceipt), nil},
		{svcPay, "result: ACK with a forged receipt", "POST", payapi.ResultPath("p-2"), holder("5", proof(acct, 5)), `{"outcome":"ACK","railRef":"rail-000001","railToken":5,"receipt":"test-rail.AAAA"}`, 422, string(payapi.CodeInvalidReceipt), nil},
		{svcPay, "result: unknown outcome", "POST", payapi.ResultPath("p-2"), holder("5", proof(acct, 5)), `{"outcome":"MAYBE"}`, 400, string(payapi.CodeInvalidRequest), nil},
		{svcPay, "result: payout not claimed", "POST", payapi.ResultPath("p-1"), holder("6", proof(acct, 6)), `{"outcome":"AMBIGUOUS"}`, 409, string(payapi.CodePayoutNotClaimed), nil},
		{svcPay, "account: query parameter on the create", "POST", payapi.PathAccounts + "?dryRun=1", js, `{"accountId":"acct-9","currency":"EUR","openingBalanceMinor":1}`, 400, string(payapi.CodeInvalidRequest), nil},
		{svcPay, "claim: query parameter", "POST", payapi.ClaimPath("p-1") + "?force=1", holder("6", proof(acct, 6)), ``, 400, string(payapi.CodeInvalidRequest), nil},
		{svcPay, "DELETE a payout", "DELETE", payapi.PayoutPath("p-1"), nil, ``, 405, string(payapi.CodeMethodNotAllowed), nil},
		{svcPay, "unknown route", "GET", "/v1/refunds", nil, ``, 404, string(payapi.CodeNotFound), nil},

		// rail-proxy
		{svcProxy, "no fencing token", "POST", railapi.PathSubmissions, p1(with(railapi.HeaderProof, proof(acct, 6))), sub, 400, string(railapi.CodeInvalidToken), nil},
		{svcProxy, "token 0", "POST", railapi.PathSubmissions, p1(holder("0", proof(acct, 0))), sub, 400, string(railapi.CodeInvalidToken), nil},
		{svcProxy, "token sent with a leading zero", "POST", railapi.PathSubmissions, p1(holder("06", proof(acct, 6))), sub, 400, string(railapi.CodeInvalidToken), nil},
		{svcProxy, "no proof", "POST", railapi.PathSubmissions, p1(holder("6", "")), sub, 403, string(railapi.CodeUnverifiedToken), nil},
		{svcProxy, "proof of another account's lock", "POST", railapi.PathSubmissions, p1(holder("6", proof("acct-2", 6))), sub, 403, string(railapi.CodeUnverifiedToken), nil},
		{svcProxy, "forged maximum token, garbage proof", "POST", railapi.PathSubmissions, p1(holder(tokenLimit, "v1.1.test-lock.AAAA")), sub, 403, string(railapi.CodeUnverifiedToken), nil},
		{svcProxy, "stale token with a valid proof", "POST", railapi.PathSubmissions, p1(holder("4", proof(acct, 4))), sub, 409, string(railapi.CodeFencedOut), []string{"rail_attempt"}},
		{svcProxy, "owner header over 128 bytes", "POST", railapi.PathSubmissions, p1(with(railapi.HeaderToken, "6", railapi.HeaderProof, proof(acct, 6), railapi.HeaderOwner, strings.Repeat("é", 70))), sub, 400, string(railapi.CodeInvalidRequest), nil},
		{svcProxy, "lower-case currency", "POST", railapi.PathSubmissions, holder("6", proof(acct, 6)), `{"payoutId":"p-1","accountId":"acct-1","amountMinor":2500,"currency":"eur"}`, 400, string(railapi.CodeInvalidRequest), nil},
		{svcProxy, "amount 0", "POST", railapi.PathSubmissions, holder("6", proof(acct, 6)), `{"payoutId":"p-1","accountId":"acct-1","amountMinor":0,"currency":"EUR"}`, 400, string(railapi.CodeInvalidRequest), nil},
		{svcProxy, "unknown field", "POST", railapi.PathSubmissions, holder("6", proof(acct, 6)), `{"payoutId":"p-1","accountId":"acct-1","amountMinor":2500,"currency":"EUR","railRef":"x"}`, 400, string(railapi.CodeInvalidRequest), nil},
		{svcProxy, "no content type, with a body", "POST", railapi.PathSubmissions, []string{railapi.HeaderToken, "6", railapi.HeaderProof, proof(acct, 6), railapi.HeaderOwner, "worker-b"}, sub, 415, string(railapi.CodeUnsupportedMediaType), nil},
		{svcProxy, "content type sent twice", "POST", railapi.PathSubmissions, append(holder("6", proof(acct, 6)), "Content-Type", ctJSON), sub, 400, string(railapi.CodeInvalidRequest), nil},
		// Terms payment-resource did not sign, each
		// with token 6 and its proof, above the high-water.
		{svcProxy, "terms: no signature", "POST", railapi.PathSubmissions, holder("6", proof(acct, 6)), submission("p-1", "acct-1", 2500), 403, string(railapi.CodeTermsUnsigned), nil},
		{svcProxy, "terms: amount other than the payout's", "POST", railapi.PathSubmissions, signedBy(holder("6", proof(acct, 6)), termsOf("p-1", "acct-1", 2500)), submission("p-1", "acct-1", 250000), 403, string(railapi.CodeInvalidTerms), nil},
		{svcProxy, "terms: payout id paydb does not know", "POST", railapi.PathSubmissions, signedBy(holder("6", proof(acct, 6)), termsOf("p-1", "acct-1", 2500)), submission("p-ghost", "acct-1", 2500), 403, string(railapi.CodeInvalidTerms), nil},
		{svcProxy, "terms: payout of another account", "POST", railapi.PathSubmissions, signedBy(holder("6", proof("acct-2", 6)), termsOf("p-1", "acct-1", 2500)), submission("p-1", "acct-2", 2500), 403, string(railapi.CodeInvalidTerms), nil},
		{svcProxy, "terms: signed by a key rail-proxy does not hold", "POST", railapi.PathSubmissions, signedBy(holder("6", proof(acct, 6)),
			fencingtest.ReceiptSigningKey().Sign(fencewire.PayoutTermsDomain, fencewire.PayoutTerms{PayoutID: "p-1", AccountID: "acct-1", AmountMinor: 2500, Currency: "EUR"}.Fields()...)),
			submission("p-1", "acct-1", 2500), 403, string(railapi.CodeTermsKeyUnknown), nil},
		{svcProxy, "payoutId with an escaped lone surrogate", "POST", railapi.PathSubmissions, holder("6", proof(acct, 6)), `{"payoutId":"p-\udc00","accountId":"acct-1","amountMinor":2500,"currency":"EUR"}`, 400, string(railapi.CodeInvalidRequest), nil},
		{svcProxy, "query parameter on a submission", "POST", railapi.PathSubmissions + "?dryRun=1", p1(holder("6", proof(acct, 6))), sub, 400, string(railapi.CodeInvalidRequest), nil},
		{svcProxy, "attempts without payoutId", "GET", railapi.PathAttempts, nil, ``, 400, string(railapi.CodeInvalidRequest), nil},
		{svcProxy, "high-water of a malformed account id", "GET", "/v1/rail/high-water/acct 1", nil, ``, 400, string(railapi.CodeInvalidRequest), nil},
		{svcProxy, "GET the submissions", "GET", railapi.PathSubmissions, nil, ``, 405, string(railapi.CodeMethodNotAllowed), nil},

		// rail-stub
		{svcStub, "malformed JSON", "POST", rail.PathSubmit, js, `{"payoutId":`, 400, string(railapi.CodeInvalidRequest), nil},
		{svcStub, "amount 0", "POST", rail.PathSubmit, js, strings.Replace(stubOK, "2500", "0", 1), 400, string(railapi.CodeInvalidRequest), nil},
		{svcStub, "lower-case currency", "POST", rail.PathSubmit, js, strings.Replace(stubOK, "EUR", "eur", 1), 400, string(railapi.CodeInvalidRequest), nil},
		{svcStub, "no reference", "POST", rail.PathSubmit, js, `{"payoutId":"p-1","accountId":"acct-1","amountMinor":2500,"currency":"EUR"}`, 400, string(railapi.CodeInvalidRequest), nil},
		{svcStub, "reference not UTF-8", "POST", rail.PathSubmit, js, strings.Replace(stubOK, `"reference":"p-1"`, "\"reference\":\"p-\xff1\"", 1), 400, string(railapi.CodeInvalidRequest), nil},
		{svcStub, "reference with an escaped lone surrogate", "POST", rail.PathSubmit, js, strings.Replace(stubOK, `"reference":"p-1"`, `"reference":"p-\udc001"`, 1), 400, string(railapi.CodeInvalidRequest), nil},
		{svcStub, "reference with NUL", "POST", rail.PathSubmit, js, strings.Replace(stubOK, `"reference":"p-1"`, `"reference":"p-\u00001"`, 1), 400, string(railapi.CodeInvalidRequest), nil},
		{svcStub, "payoutId with a newline", "POST", rail.PathSubmit, js, strings.Replace(stubOK, `"payoutId":"p-1"`, `"payoutId":"p-1\nACK"`, 1), 400, string(railapi.CodeInvalidRequest), nil},
		{svcStub, "content type with charset=latin1", "POST", rail.PathSubmit, []string{"Content-Type", "application/json; charset=latin1"}, stubOK, 415, string(railapi.CodeUnsupportedMediaType), nil},
		{svcStub, "content type text/plain", "POST", rail.PathSubmit, []string{"Content-Type", "text/plain"}, stubOK, 415, string(railapi.CodeUnsupportedMediaType), nil},
		{svcStub, "no content type, with a body", "POST", rail.PathSubmit, nil, stubOK, 415, string(railapi.CodeUnsupportedMediaType), nil},
		{svcStub, "content type sent twice", "POST", rail.PathSubmit, twice, stubOK, 400, string(railapi.CodeInvalidRequest), nil},
		{svcStub, "fault of an unknown mode", "POST", "/admin/faults", js, `{"failNext":1,"mode":"explode"}`, 400, string(railapi.CodeInvalidRequest), nil},
		{svcStub, "failNext of int64's maximum", "POST", "/admin/faults", js, `{"failNext":9223372036854775807,"mode":"error"}`, 400, string(railapi.CodeInvalidRequest), nil},
		{svcStub, "query parameter on " + rail.PathSubmit, "POST", rail.PathSubmit + "?dryRun=1", js, stubOK, 400, string(railapi.CodeInvalidRequest), nil},
		{svcStub, "misspelt filter of " + rail.PathJournal, "GET", rail.PathJournal + "?payout=p-1", nil, ``, 400, string(railapi.CodeInvalidRequest), nil},
		{svcStub, "GET " + rail.PathSubmit, "GET", rail.PathSubmit, nil, ``, 405, rail.CodeMethodNotAllowed, nil},
		{svcStub, "stop order without a reference", "POST", rail.PathStops, js, `{}`, 400, string(railapi.CodeInvalidRequest), nil},
		{svcStub, "stop order with an unknown field", "POST", rail.PathStops, js, `{"reference":"p-1","force":true}`, 400, string(railapi.CodeInvalidRequest), nil},
		{svcStub, "stop order reference not UTF-8", "POST", rail.PathStops, js, "{\"reference\":\"p-\xff\"}", 400, string(railapi.CodeInvalidRequest), nil},
		{svcStub, "stop order reference with NUL", "POST", rail.PathStops, js, `{"reference":"p-\u0000"}`, 400, string(railapi.CodeInvalidRequest), nil},
		{svcStub, "stop order reference with a newline", "POST", rail.PathStops, js, `{"reference":"p-1\n"}`, 400, string(railapi.CodeInvalidRequest), nil},
		{svcStub, "GET " + rail.PathStops, "GET", rail.PathStops, nil, ``, 405, rail.CodeMethodNotAllowed, nil},
		{svcStub, "unknown path", "POST", "/refund", js, `{}`, 404, rail.CodeNotFound, nil},

		// reconciler (the trigger of a pass; it takes no parameters)
		{svcRecon, "run: content type with charset=latin1", "POST", reconciler.PathRuns, []string{"Content-Type", "application/json; charset=latin1"}, `{}`, 415, jsonhandler.CodeUnsupportedMediaType, nil},
		{svcRecon, "run: a body without content type", "POST", reconciler.PathRuns, nil, `{}`, 415, jsonhandler.CodeUnsupportedMediaType, nil},
		{svcRecon, "run: content type sent twice", "POST", reconciler.PathRuns, twice, `{}`, 400, jsonhandler.CodeInvalidRequest, nil},
		{svcRecon, "run: a parameter", "POST", reconciler.PathRuns, js, `{"dryRun":true}`, 400, jsonhandler.CodeInvalidRequest, nil},
		{svcRecon, "run: a query parameter", "POST", reconciler.PathRuns + "?dryRun=1", nil, ``, 400, jsonhandler.CodeInvalidRequest, nil},
		{svcRecon, "GET a run", "GET", reconciler.PathRuns, nil, ``, 405, string(payapi.CodeMethodNotAllowed), nil},

		// executor push
		{svcPush, "GET instead of a push", "GET", "/", nil, ``, 405, string(payapi.CodeMethodNotAllowed), nil},
		{svcPush, "body over 64 KiB", "POST", "/", js, strings.Repeat("x", 65<<10), 413, string(lockapi.CodeBodyTooLarge), nil},
		{svcPush, "message data not base64 (acked, dropped)", "POST", "/", js, `{"message":{"data":"%%%","messageId":"m-1"}}`, 204, codeNone, nil},
		{svcPush, "event with an unknown field (acked, dropped)", "POST", "/", js, push(`{"payoutId":"p-1","accountId":"acct-1","amountMinor":2500,"currency":"EUR","priority":1}`), 204, codeNone, nil},
		{svcPush, "event with amount 0 (acked, dropped)", "POST", "/", js, push(`{"payoutId":"p-1","accountId":"acct-1","amountMinor":0,"currency":"EUR"}`), 204, codeNone, nil},
		// The next two take the lock of the account they name for their
		// claim, which payment-resource refuses: acct-2's, free (on
		// acct-1's, held here by worker-a, they wait for it and are
		// redelivered, 503 LOCK_BUSY, until it is free).
		{svcPush, "event of an unknown payout (acked, dropped)", "POST", "/", js, push(`{"payoutId":"p-404","accountId":"acct-2","amountMinor":1,"currency":"EUR"}`), 200, codeNone, nil},
		{svcPush, "event that names another account than its payout's (acked, dropped)", "POST", "/", js, push(`{"payoutId":"p-1","accountId":"acct-2","amountMinor":2500,"currency":"EUR"}`), 200, codeNone, nil},
	}
}

// state is everything a row could change: the two databases, the rail's
// record and lock-server's lock of acct-1.
func (w *world) state(t *testing.T, r row) map[string]string {
	t.Helper()
	out := map[string]string{}
	for svc, db := range w.dbs {
		tables, err := fuzztest.Snapshot(context.Background(), db)
		if err != nil {
			t.Fatal(err)
		}
		for name, d := range tables {
			if !slices.Contains(r.allowed, name) {
				out[svc+"."+name] = d
			}
		}
	}
	out["rail-stub.records"] = fmt.Sprint(len(w.stub.Submissions("")))
	st, err := w.lockKeys.Inspect(context.Background(), "payout:acct-1")
	out["lock-server.payout:acct-1"] = fmt.Sprintf("%v %d %+v", err, st.LastToken, st.Lease)
	if st.Lease != nil {
		out["lock-server.payout:acct-1"] = fmt.Sprintf("%d %+v", st.LastToken, *st.Lease)
	}
	return out
}

// TestBadInputTable sends every row to its service and checks the status
// and code, the answer's properties and that nothing changed; then it
// compares the table it made with the one in docs/reliability.md (or
// writes it there with -update).
func TestBadInputTable(t *testing.T) {
	w := newWorld(t)
	w.setup(t)
	var table strings.Builder
	table.WriteString("| Service | Bad input | Request | Status | Code |\n|---|---|---|---|---|\n")
	seen := map[string]bool{}
	for _, r := range rows() {
		if seen[r.service+r.name] {
			t.Fatalf("row %s %q is named twice", r.service, r.name)
		}
		seen[r.service+r.name] = true
		t.Run(r.service+"/"+r.name, func(t *testing.T) {
			before := w.state(t, r)
			rec := w.send(r)
			a := fuzztest.FromRecorder(rec)
			if err := fuzztest.Check(a, fuzztest.Options{}, r.path, r.body, strings.Join(r.headers, " ")); err != nil {
				t.Error(err)
			}
			code := codeNone
			if a.Status >= 400 {
				env, _ := fuzztest.DecodeEnvelope(a.Body, false)
				code = env.Error.Code
			}
			if a.Status != r.status || code != r.code {
				t.Errorf("got %d %q; want %d %q (body %s)", a.Status, code, r.status, r.code, a.Body)
			}
			after := w.state(t, r)
			for k, v := range before {
				if after[k] != v {
					t.Errorf("the refusal changed %s:\nbefore %s\nafter  %s", k, v, after[k])
				}
			}
		})
		code := "`" + r.code + "`"
		if r.code == codeNone {
			code = "(no envelope: acknowledged)"
		}
		fmt.Fprintf(&table, "| %s | %s | `%s %s` | %d | %s |\n", r.service, r.name, r.method, shortPath(r.path), r.status, code)
	}
	if n := len(rows()); n < 40 {
		t.Errorf("the table has %d rows; want at least 40", n)
	}
	if t.Failed() {
		return
	}
	compareOrUpdate(t, table.String())
}

// shortPath keeps a table cell readable: long runs of one byte are
// abbreviated.
func shortPath(p string) string {
	if len(p) > 60 {
		return p[:40] + "…" + p[len(p)-12:]
	}
	return strings.ReplaceAll(p, "|", `\|`)
}

// compareOrUpdate puts table between the markers of docs/reliability.md
// with -update, and otherwise fails when the document's table differs.
func compareOrUpdate(t *testing.T, table string) {
	t.Helper()
	doc, err := os.ReadFile(docPath)
	if err != nil && !(*update && os.IsNotExist(err)) {
		t.Fatalf("%v (run: go test ./harness/badinput -run TestBadInputTable -update)", err)
	}
	section := markerStart + "\n" + table + markerEnd
	start, end := bytes.Index(doc, []byte(markerStart)), bytes.Index(doc, []byte(markerEnd))
	var want []byte
	switch {
	case start >= 0 && end > start:
		want = slices.Concat(doc[:start], []byte(section), doc[end+len(markerEnd):])
	case len(doc) == 0:
		want = []byte("# Reliability\n\n" + section + "\n")
	default:
		want = slices.Concat(doc, []byte("\n"+section+"\n"))
	}
	if *update {
		if err := os.WriteFile(docPath, want, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote the bad-input table to %s", filepath.Clean(docPath))
		return
	}
	if !bytes.Equal(doc, want) {
		t.Fatalf("the bad-input table in %s differs from what the services answer; run:\n\tgo test ./harness/badinput -run TestBadInputTable -update\nand commit the result", docPath)
	}
}
