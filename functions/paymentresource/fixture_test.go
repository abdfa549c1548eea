package paymentresource_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/ledgeraudit"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/logtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// No goroutine outlives the tests: the outbox publisher and the pool's goroutines end with Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(pgtest.Tests(m),
		// The Cloud SQL connector (internal/pgpool) links OpenCensus, whose
		// view worker starts once per process and never stops.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"))
}

// waitLimit bounds every wait for an asynchronous condition.
const waitLimit = 20 * time.Second

// publishCall is one call of a fakePublisher.
type publishCall struct {
	key   string
	data  []byte
	attrs map[string]string
}

// fakePublisher records every Publish call on calls and answers err.
type fakePublisher struct {
	err   error
	calls chan publishCall
}

func newPublisher(err error) *fakePublisher {
	return &fakePublisher{err: err, calls: make(chan publishCall, 1000)}
}

func (f *fakePublisher) Publish(ctx context.Context, key string, data []byte, attrs map[string]string) error {
	select {
	case f.calls <- publishCall{key, bytes.Clone(data), attrs}:
	default:
	}
	return f.err
}

// next waits for the next Publish call.
func (f *fakePublisher) next(t *testing.T) publishCall {
	t.Helper()
	select {
	case c := <-f.calls:
		return c
	case <-time.After(waitLimit):
		t.Fatalf("no Publish call within %v", waitLimit)
		return publishCall{}
	}
}

// fixture is one payment-resource over a fresh database.
type fixture struct {
	t    *testing.T
	dsn  string
	svc  *paymentresource.Service
	h    http.Handler
	logs *logtest.Buffer
	db   *pgxpool.Pool // the test's own pool, for checks and corruption

	// payouts are the payouts createPayout made, by id, so that do can
	// sign what lock-server and rail-proxy would (see do).
	payouts map[string]api.PayoutRequest
	// raw turns do's signing off: requests go as written.
	raw bool
}

type option func(*paymentresource.Config)

func fencingOff(c *paymentresource.Config) { c.FencingDisabled = true }

func newFixture(t *testing.T, pub paymentresource.Publisher, opts ...option) *fixture {
	t.Helper()
	return newFixtureOn(t, pgtest.NewDatabase(t), pub, opts...)
}

// newFixtureOn is newFixture over the database dsn (one of a cluster of
// the test's own, for a test that freezes or stops it).
func newFixtureOn(t *testing.T, dsn string, pub paymentresource.Publisher, opts ...option) *fixture {
	t.Helper()
	f := &fixture{t: t, dsn: dsn, logs: &logtest.Buffer{}, payouts: map[string]api.PayoutRequest{}}
	f.start(pub, opts...)
	db, err := pgxpool.New(context.Background(), f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	f.db = db
	return f
}

// start runs a Service over the fixture's database (again, after a Close).
func (f *fixture) start(pub paymentresource.Publisher, opts ...option) {
	f.t.Helper()
	cfg := paymentresource.DefaultConfig()
	cfg.DatabaseURL, cfg.OutboxPoll = f.dsn, 10*time.Millisecond
	cfg.ProofKeys, cfg.ReceiptKeys = fencingtest.ProofKeys(), fencingtest.ReceiptKeys()
	cfg.TermsKey = fencingtest.TermsSigningKey()
	// No early stall detection unless a test asks for it (see
	// stall_test.go): under -race on a starved machine paydb can take
	// longer than StallAfter to answer anything, even a ping.
	cfg.StallAfter = 0
	for _, o := range opts {
		o(&cfg)
	}
	log := slog.New(slog.NewJSONHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	svc, err := paymentresource.New(context.Background(), cfg, pub, log)
	if err != nil {
		f.t.Fatalf("New: %v", err)
	}
	f.t.Cleanup(svc.Close)
	f.svc, f.h = svc, svc.Handler()
}

// do sends one request to the handler; headers come in name, value pairs.
// Unless f.raw is set, it plays the honest holder's services for a fenced
// request on /v1/payouts/{id}/...: a request with one token header and no
// proof header gets lock-server's proof of that token on the payout's
// account lock, and a result body with an ACK or DECLINE and no receipt
// gets rail-proxy's receipt over it (for the payout createPayout made; an
// unknown payout gets proofs for account "unknown").
func (f *fixture) do(method, path, body string, headers ...string) (int, []byte) {
	f.t.Helper()
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	if !f.raw {
		body = f.sign(r, path, body)
		r = r.Clone(r.Context())
		r.Body = io.NopCloser(strings.NewReader(body))
		r.ContentLength = int64(len(body))
	}
	if body != "" && r.Header.Get("Content-Type") == "" {
		r.Header.Set("Content-Type", "application/json")
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w.Code, w.Body.Bytes()
}

// sign adds the proof header and the receipt described on do, and returns
// the body to send.
func (f *fixture) sign(r *http.Request, path, body string) string {
	path, _, _ = strings.Cut(path, "?")
	rest, ok := strings.CutPrefix(path, "/v1/payouts/")
	id, _, _ := strings.Cut(rest, "/")
	toks := r.Header.Values(fencewire.HeaderToken)
	token, err := strconv.ParseInt(strings.Join(toks, ""), 10, 64)
	if !ok || len(toks) != 1 || err != nil || token <= 0 {
		return body
	}
	p, known := f.payouts[id]
	if !known {
		p = api.PayoutRequest{PayoutID: id, AccountID: "unknown"}
	}
	if r.Header.Get(fencewire.HeaderProof) == "" {
		r.Header.Set(fencewire.HeaderProof, fencingtest.Proof(p.AccountID, token))
	}
	var req map[string]any
	if !strings.HasSuffix(path, "/result") || json.Unmarshal([]byte(body), &req) != nil || req["receipt"] != nil {
		return body
	}
	outcome, _ := req["outcome"].(string)
	ref, _ := req["railRef"].(string)
	railTok := token
	if v, ok := req["railToken"].(float64); ok && v > 0 {
		railTok = int64(v)
	}
	if outcome != string(api.OutcomeAck) && outcome != string(api.OutcomeDecline) {
		return body
	}
	req["receipt"] = fencingtest.Receipt(fencewire.RailReceipt{PayoutID: id, AccountID: p.AccountID, AmountMinor: p.AmountMinor,
		Currency: p.Currency, Outcome: outcome, RailRef: ref, RailToken: railTok})
	b, err := json.Marshal(req)
	if err != nil {
		f.t.Fatal(err)
	}
	return string(b)
}

func decode[T any](t *testing.T, body []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("answer %s: %v", body, err)
	}
	return v
}

// want checks the status of an answer and, for an error, its code.
func want(t *testing.T, what string, status int, body []byte, wantStatus int, wantCode api.Code) {
	t.Helper()
	if status != wantStatus {
		t.Fatalf("%s: status %d, want %d; body %s", what, status, wantStatus, body)
	}
	if wantCode != "" {
		env := decode[api.ErrorEnvelope](t, body)
		if env.Error.Code != wantCode {
			t.Fatalf("%s: code %q, want %q; body %s", what, env.Error.Code, wantCode, body)
		}
	}
}

func (f *fixture) createAccount(id, ccy string, opening int64) api.Account {
	f.t.Helper()
	st, body := f.do("POST", "/v1/accounts", fmt.Sprintf(`{"accountId":%q,"currency":%q,"openingBalanceMinor":%d}`, id, ccy, opening))
	want(f.t, "create account "+id, st, body, http.StatusCreated, "")
	return decode[api.Account](f.t, body)
}

func (f *fixture) createPayout(id, account string, amount int64, ccy string) api.Payout {
	f.t.Helper()
	st, body := f.do("POST", "/v1/payouts", fmt.Sprintf(`{"payoutId":%q,"accountId":%q,"amountMinor":%d,"currency":%q}`, id, account, amount, ccy))
	want(f.t, "create payout "+id, st, body, http.StatusCreated, "")
	f.payouts[id] = api.PayoutRequest{PayoutID: id, AccountID: account, AmountMinor: amount, Currency: ccy}
	return decode[api.Payout](f.t, body)
}

func (f *fixture) claim(id string, token int64, owner string) (int, []byte) {
	f.t.Helper()
	return f.do("POST", "/v1/payouts/"+id+"/claim", "",
		fencewire.HeaderToken, strconv.FormatInt(token, 10), fencewire.HeaderOwner, owner)
}

func (f *fixture) result(id string, token int64, owner, outcome, railRef string) (int, []byte) {
	f.t.Helper()
	return f.do("POST", "/v1/payouts/"+id+"/result", fmt.Sprintf(`{"outcome":%q,"railRef":%q}`, outcome, railRef),
		fencewire.HeaderToken, strconv.FormatInt(token, 10), fencewire.HeaderOwner, owner)
}

func (f *fixture) account(id string) api.Account {
	f.t.Helper()
	st, body := f.do("GET", "/v1/accounts/"+id, "")
	want(f.t, "get account "+id, st, body, http.StatusOK, "")
	return decode[api.Account](f.t, body)
}

func (f *fixture) payout(id string) api.Payout {
	f.t.Helper()
	st, body := f.do("GET", api.WithHistory(api.PayoutPath(id)), "")
	want(f.t, "get payout "+id, st, body, http.StatusOK, "")
	return decode[api.Payout](f.t, body)
}

func (f *fixture) audit() api.AuditReport {
	f.t.Helper()
	rep, err := ledgeraudit.Run(context.Background(), f.db)
	if err != nil {
		f.t.Fatalf("Audit: %v", err)
	}
	st, body := f.do("GET", "/v1/audit", "")
	want(f.t, "GET /v1/audit", st, body, http.StatusOK, "")
	if got := decode[api.AuditReport](f.t, body); got.Balanced != rep.Balanced || len(got.Violations) != len(rep.Violations) {
		f.t.Fatalf("GET /v1/audit = %+v; Audit = %+v", got, rep)
	}
	return rep
}

func (f *fixture) count(table string) int {
	f.t.Helper()
	var n int
	if err := f.db.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// snapshot renders every row the service may write, except the outbox's
// published_at (the publisher goroutine sets it at its own pace).
func (f *fixture) snapshot() string {
	f.t.Helper()
	var b strings.Builder
	for _, q := range []string{
		`SELECT coalesce(jsonb_agg(to_jsonb(t) ORDER BY account_id), '[]')::text FROM account t`,
		`SELECT coalesce(jsonb_agg(to_jsonb(t) ORDER BY payout_id), '[]')::text FROM payout t`,
		`SELECT coalesce(jsonb_agg(to_jsonb(t) ORDER BY transition_id), '[]')::text FROM payout_transition t`,
		`SELECT coalesce(jsonb_agg(to_jsonb(t) ORDER BY rail_ref), '[]')::text FROM rail_result t`,
		`SELECT coalesce(jsonb_agg(to_jsonb(t) ORDER BY txn_id), '[]')::text FROM ledger_txn t`,
		`SELECT coalesce(jsonb_agg(to_jsonb(t) ORDER BY entry_id), '[]')::text FROM ledger_entry t`,
		`SELECT coalesce(jsonb_agg(jsonb_build_array(id, ordering_key, data, attrs) ORDER BY id), '[]')::text FROM outbox`,
	} {
		var s string
		if err := f.db.QueryRow(context.Background(), q).Scan(&s); err != nil {
			f.t.Fatal(err)
		}
		b.WriteString(s)
		b.WriteByte('\n')
	}
	return b.String()
}

var errBrokerDown = errors.New("broker down")
