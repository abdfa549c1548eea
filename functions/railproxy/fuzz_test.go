package railproxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/fuzztest"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Proof modes of a fuzz input (proofMode % 4): what X-Fencing-Proof holds.
const (
	proofNone    = iota // no header
	proofValid          // lock-server's proof of the token on the body's account
	proofGarbage        // the input's proofArg, as sent
	proofOther          // lock-server's proof of the token on another account
)

// fuzzProof returns the X-Fencing-Proof value of a fuzz input: body's
// accountId (when it decodes) and the token header (when it parses) say
// what a valid proof is for.
func fuzzProof(mode uint8, arg, token string, body []byte) string {
	var b struct {
		AccountID string `json:"accountId"`
	}
	_ = json.Unmarshal(body, &b)
	tok, _ := strconv.ParseInt(strings.TrimSpace(token), 10, 64)
	switch mode % 4 {
	case proofValid:
		return fencingtest.Proof(b.AccountID, tok)
	case proofGarbage:
		return arg
	case proofOther:
		return fencingtest.Proof(b.AccountID+"-other", tok)
	}
	return ""
}

// FuzzRailProxy sends one request with an arbitrary method, path, fencing
// token, proof (none, valid, garbage, another account's), owner, content
// type and body to a rail-proxy over one raildb and a healthy rail-stub,
// and checks the answer's properties (package fuzztest), that a refusal
// reached no rail and changed no row (beyond the documented audit row of
// FENCED_OUT and PAYOUT_ALREADY_SUBMITTED, and the high-water raise of the
// latter), and that nothing reaches the rail without a valid proof.
// fuzzRig is one rail-proxy over one raildb, with a healthy rail-stub as
// its rail, for the whole of a fuzz target; db is the test's own pool.
func fuzzRig(f *testing.F) (p *railproxy.Proxy, stub *railstub.Stub, db *pgxpool.Pool) {
	stub, err := railstub.New(railstub.DefaultConfig(), slog.New(slog.DiscardHandler))
	if err != nil {
		f.Fatal(err)
	}
	rail := httptest.NewServer(stub)
	f.Cleanup(rail.Close)
	f.Cleanup(func() { _ = stub.Close() })
	dsn := pgtest.NewDatabase(f)
	cfg := railproxy.DefaultConfig()
	cfg.DB.DSN, cfg.RailURL = dsn, rail.URL
	cfg.ProofKeys, cfg.ReceiptKey = fencingtest.ProofKeys(), fencingtest.ReceiptSigningKey()
	cfg.TermsKeys = fencingtest.TermsKeys()
	p, err = railproxy.New(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = p.Close() })
	db, err = pgxpool.New(context.Background(), dsn)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(db.Close)
	return p, stub, db
}

func FuzzRailProxy(f *testing.F) {
	p, stub, db := fuzzRig(f)
	// sub is a submission of a payout payment-resource created (its terms
	// signed); unsigned the same without the signature.
	sub := func(payout, account string) []byte {
		r := api.SubmitRequest{PayoutID: payout, AccountID: account, AmountMinor: 2500, Currency: "EUR"}
		r.BodyTermsSignature = fencingtest.Terms(r.Terms()) // the previous version's body member, still accepted
		b, _ := json.Marshal(r)
		return b
	}
	unsigned := func(payout, account string) []byte {
		return fmt.Appendf(nil, `{"payoutId":%q,"accountId":%q,"amountMinor":2500,"currency":"EUR"}`, payout, account)
	}
	// acct-1's high-water is 5, and payout p-0 went to the rail.
	setup, _ := fuzztest.NewRequest(0, api.PathSubmissions, sub("p-0", "acct-1"),
		"Content-Type", "application/json", api.HeaderToken, "5", api.HeaderProof, fencingtest.Proof("acct-1", 5))
	if rec := httptest.NewRecorder(); func() int { p.ServeHTTP(rec, setup); return rec.Code }() != http.StatusOK {
		f.Fatalf("setup submission refused: %s", rec.Body)
	}

	const ct = "application/json"
	for _, s := range []struct {
		method              uint8
		path, token         string
		proofMode           uint8
		proofArg, owner, ct string
		body                []byte
	}{
		{0, "", "6", proofValid, "", "worker-a", ct, sub("p-1", "acct-1")},
		{0, "", "7", proofValid, "", "", ct, sub("p-0", "acct-1")},
		{0, "", "3", proofValid, "", "worker-a", ct, sub("p-2", "acct-1")},
		{0, "", "9223372036854775807", proofNone, "", "", ct, sub("p-x", "acct-1")},
		{0, "", "9223372036854775807", proofGarbage, "v1.1.test-lock.AAAA", "", ct, sub("p-x", "acct-1")},
		{0, "", "50", proofOther, "", "", ct, sub("p-3", "acct-1")},
		{0, "", "", proofNone, "", "", ct, sub("p-4", "acct-1")},
		{0, "", "0", proofValid, "", "", ct, sub("p-4", "acct-1")},
		{0, "", "-1", proofValid, "", "", ct, sub("p-4", "acct-1")},
		{0, "", "+8", proofValid, "", "", ct, sub("p-4", "acct-1")},
		{0, "", "1e3", proofValid, "", "", ct, sub("p-4", "acct-1")},
		{0, "", "60", proofValid, "", "", "text/plain", sub("p-4", "acct-1")},
		{0, "", "61", proofValid, "", "", ct, []byte(`{"payoutId":"p-5","accountId":"acct-1","amountMinor":0,"currency":"EUR"}`)},
		{0, "", "62", proofValid, "", "", ct, []byte(`{"payoutId":"p-5","accountId":"acct-1","amountMinor":1,"currency":"eur"}`)},
		{0, "", "63", proofValid, "", "", ct, []byte(`{"payoutId":"p 5","accountId":"acct-1","amountMinor":1,"currency":"EUR"}`)},
		{0, "", "64", proofValid, "", "", ct, append(sub("p-5", "acct-1"), " {}"...)},
		{0, "", "65", proofValid, "", "", ct, []byte(`{"payoutId":"p-5","payoutId":"p-6","accountId":"acct-1","amountMinor":1,"currency":"EUR"}`)},
		{0, "", "66", proofValid, "", "w\xff", ct, sub("p-7", "acct-1")},
		{0, "", "67", proofValid, "", strings.Repeat("é", 70), ct, sub("p-7", "acct-1")},
		{0, "", "69", proofValid, "", "", ct, unsigned("p-9", "acct-1")},
		{0, "", "70", proofValid, "", "", ct, []byte(strings.Replace(string(sub("p-9", "acct-1")), "2500", "2501", 1))},
		{1, "/v1/rail/high-water/acct-1", "", proofNone, "", "", "", nil},
		{1, "/v1/rail/high-water/acct 1", "", proofNone, "", "", "", nil},
		{1, "/v1/rail/attempts", "", proofNone, "", "", "", nil},
		{1, "/v1/rail/nope", "", proofNone, "", "", "", nil},
		{1, "/v1/rail/high-water/acct-1?at=1", "", proofNone, "", "", "", nil},
		{0, api.PathSubmissions + "?dryRun=1", "71", proofValid, "", "", ct, sub("p-10", "acct-1")},
		{3, "", "68", proofValid, "", "", ct, sub("p-8", "acct-1")},
	} {
		f.Add(s.method, s.path, s.token, s.proofMode, s.proofArg, s.owner, s.ct, s.body)
	}
	f.Fuzz(func(t *testing.T, method uint8, path, token string, proofMode uint8, proofArg, owner, contentType string, body []byte) {
		if path == "" {
			path = api.PathSubmissions
		}
		if !fuzztest.Canonical(path) {
			return // refused by the server constructor first
		}
		proof := fuzzProof(proofMode, proofArg, token, body)
		req, ok := fuzztest.NewRequest(method, path, body, "Content-Type", contentType,
			api.HeaderToken, token, api.HeaderProof, proof, api.HeaderOwner, owner)
		if !ok {
			return
		}
		ctx := context.Background()
		before, err := fuzztest.Snapshot(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		records := len(stub.Submissions(""))
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, req)
		a := fuzztest.FromRecorder(rec)
		if err := fuzztest.Check(a, fuzztest.Options{ExtraEnvelopeFields: true}, path, token, proof, owner, contentType, string(body)); err != nil {
			t.Fatalf("%s %q token %q proof %q owner %q: %v", req.Method, path, token, proof, owner, err)
		}
		after, err := fuzztest.Snapshot(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		changed := before.Changed(after)
		newRecords := len(stub.Submissions("")) - records
		if a.Status >= 400 {
			env, _ := fuzztest.DecodeEnvelope(a.Body, true)
			var allowed []string
			switch api.Code(env.Error.Code) {
			case api.CodeFencedOut:
				allowed = []string{"rail_attempt"}
			case api.CodeAlreadySubmitted:
				allowed = []string{"rail_attempt", "rail_high_water"}
			}
			for _, c := range changed {
				if !slices.Contains(allowed, c) {
					t.Fatalf("refused %s %q (%d %s) changed table %s", req.Method, path, a.Status, env.Error.Code, c)
				}
			}
			if newRecords != 0 {
				t.Fatalf("refused %s %q (%d %s) reached the rail %d times", req.Method, path, a.Status, env.Error.Code, newRecords)
			}
			return
		}
		if newRecords > 0 && proofMode%4 != proofValid {
			t.Fatalf("a submission with proof %q (mode %d) reached the rail", proof, proofMode%4)
		}
		if req.Method == http.MethodPost && newRecords != 1 {
			t.Fatalf("accepted submission (%d) reached the rail %d times", a.Status, newRecords)
		}
	})
}

// FuzzRailProxySubmission sends well-formed submissions with arbitrary
// field values and a valid proof of their token on their account: what
// rail-proxy accepts, the rail must accept too (a submission rail-proxy
// validates but the rail refuses would come back 502 RAIL_AMBIGUOUS, a 5xx
// for client input, with the money's fate unknown), and an accepted one
// reaches the rail once with exactly its fields.
func FuzzRailProxySubmission(f *testing.F) {
	p, stub, _ := fuzzRig(f)
	f.Add("p-1", "acct-1", int64(2500), "EUR", int64(10))
	f.Add("p-2", "acct-1", int64(1), "JPY", int64(11))
	f.Add("p-3", strings.Repeat("a", 64), int64(1_000_000_000_000_000), "EUR", int64(12))
	f.Add(strings.Repeat("p", 128), "acct-2", int64(1), "EUR", int64(1))
	f.Add("p-4", "acct-3", int64(0), "EUR", int64(1))
	f.Add("p-5", "acct-3", int64(-1), "ZZZ", int64(1))
	f.Add("p:6.x_y-z", "a.b_c:d-e", int64(9_223_372_036_854_775_807), "EUR", int64(9_223_372_036_854_775_807))
	f.Add("p-7", "acct-4", int64(1), "EUR", int64(0))
	f.Add("é", "acct-4", int64(1), "EUR", int64(2))
	f.Fuzz(func(t *testing.T, payout, account string, amount int64, currency string, token int64) {
		sub := api.SubmitRequest{PayoutID: payout, AccountID: account, AmountMinor: amount, Currency: currency}
		sig := fencingtest.Terms(sub.Terms()) // as payment-resource signs the payouts it created
		body, err := json.Marshal(sub)
		if err != nil {
			t.Fatal(err)
		}
		req, _ := fuzztest.NewRequest(0, api.PathSubmissions, body, "Content-Type", "application/json",
			api.HeaderToken, strconv.FormatInt(token, 10), api.HeaderProof, fencingtest.Proof(account, token), api.HeaderTermsSignature, sig)
		records := len(stub.Submissions(""))
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, req)
		a := fuzztest.FromRecorder(rec)
		if err := fuzztest.Check(a, fuzztest.Options{ExtraEnvelopeFields: true}, string(body)); err != nil {
			t.Fatalf("submission %s token %d: %v", body, token, err)
		}
		got := stub.Submissions("")[records:]
		if a.Status != http.StatusOK {
			if len(got) != 0 {
				t.Fatalf("refused submission %s (%d) reached the rail", body, a.Status)
			}
			return
		}
		want := rail.SubmitRequest{PayoutID: payout, AccountID: account, AmountMinor: amount, Currency: currency, Reference: payout}
		if len(got) != 1 || got[0].Request != want {
			t.Fatalf("accepted submission %s reached the rail as %+v; want once as %+v", body, got, want)
		}
	})
}
