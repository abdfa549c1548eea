package paymentresource_test

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
)

func (f *fixture) attention(id string, token int64, owner, reason string) (int, []byte) {
	f.t.Helper()
	return f.do("POST", api.AttentionPath(id), fmt.Sprintf(`{"reason":%q}`, reason),
		fencewire.HeaderToken, strconv.FormatInt(token, 10), fencewire.HeaderOwner, owner)
}

// attentionCount reads payouts_needing_attention_total{reason}.
func attentionCount(t *testing.T, reason api.AttentionReason) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	for _, c := range paymentresource.Collectors() {
		if err := reg.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range fams {
		if fam.GetName() != "payouts_needing_attention_total" {
			continue
		}
		for _, m := range fam.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() != "reason" {
					t.Fatalf("label %q on %s", l.GetName(), fam.GetName())
				}
				if l.GetValue() == string(reason) {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no payouts_needing_attention_total{reason=%q}", reason)
	return 0
}

// TestNeedsAttentionRecordsWhyAndStopsClaims: the current holder marks a
// payout needs_attention with a reason; the payout's GET and history say
// why, the metric counts it once, claims are refused
// PAYOUT_NEEDS_ATTENTION (whatever the token), marking again changes
// nothing, a stale holder cannot mark, and a fenced result resolves it.
func TestNeedsAttentionRecordsWhyAndStopsClaims(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 1_000)
	f.createPayout("p-1", "acct-1", 100, "EUR")
	f.createPayout("p-2", "acct-1", 100, "EUR")
	st, body := f.claim("p-1", 5, "w")
	want(t, "claim p-1", st, body, http.StatusOK, "")
	const reason = api.ReasonPayoutNotClaimed // no other test marks with it (the counter is global)
	before := attentionCount(t, reason)

	st, body = f.attention("p-1", 4, "stale", string(reason))
	want(t, "mark by a stale holder", st, body, http.StatusConflict, api.CodeFencedOut)
	st, body = f.attention("p-1", 5, "w", "because")
	want(t, "mark with an unknown reason", st, body, http.StatusBadRequest, api.CodeInvalidRequest)
	st, body = f.do("POST", api.AttentionPath("p-1"), fmt.Sprintf(`{"reason":%q}`, reason),
		fencewire.HeaderToken, "5", fencewire.HeaderProof, fencingtest.Proof("acct-2", 5))
	want(t, "mark with a proof for another account's lock", st, body, http.StatusForbidden, api.CodeUnverifiedToken)
	if p := f.payout("p-1"); p.State != api.StateClaimed {
		t.Fatalf("p-1 is %s after refused marks; want claimed", p.State)
	}

	st, body = f.attention("p-1", 5, "w", string(reason))
	want(t, "mark by the holder", st, body, http.StatusOK, "")
	p := f.payout("p-1")
	last := p.History[len(p.History)-1]
	if p.State != api.StateNeedsAttention || p.AttentionReason != reason ||
		last.From != api.StateClaimed || last.To != api.StateNeedsAttention || last.Reason != reason || last.Token != 5 {
		t.Fatalf("p-1 = %s (%q), last transition %+v; want needs_attention with reason %s, token 5", p.State, p.AttentionReason, last, reason)
	}
	rows := len(p.History)
	st, body = f.attention("p-1", 5, "w", string(api.ReasonRailRefConflict))
	want(t, "mark again (a lost answer)", st, body, http.StatusOK, "")
	if p := f.payout("p-1"); len(p.History) != rows || p.AttentionReason != reason {
		t.Fatalf("marking again changed the payout: %d rows, reason %q", len(p.History), p.AttentionReason)
	}
	if got := attentionCount(t, reason) - before; got != 1 {
		t.Fatalf("payouts_needing_attention_total{reason=%q} went up by %v; want 1", reason, got)
	}
	if lines := f.logs.Events(t, api.EventPayoutNeedsAttention); len(lines) != 1 || lines[0]["reason"] != string(reason) {
		t.Fatalf("%s lines = %v; want one with the reason", api.EventPayoutNeedsAttention, lines)
	}
	for _, tok := range []int64{4, 5, 99} {
		st, body = f.claim("p-1", tok, "w2")
		want(t, fmt.Sprintf("claim of a payout needing attention with %d", tok), st, body, http.StatusConflict, api.CodePayoutNeedsAttention)
	}

	// Resolution: a fenced result under a newer lease (the reconciler's).
	st, body = f.result("p-1", 4, "stale", "DECLINE", "rail-x")
	want(t, "a stale result for a payout needing attention", st, body, http.StatusConflict, api.CodeFencedOut)
	st, body = f.result("p-1", 6, "reconciler", "ACK", "rail-1")
	want(t, "the result that resolves it", st, body, http.StatusOK, "")
	if p := f.payout("p-1"); p.State != api.StatePosted || p.AttentionReason != "" || p.Debits != 1 {
		t.Fatalf("p-1 = %s (%q) with %d debits; want posted, no reason, one debit", p.State, p.AttentionReason, p.Debits)
	}
	st, body = f.attention("p-1", 7, "w", string(reason))
	want(t, "mark of a finished payout", st, body, http.StatusConflict, api.CodePayoutFinished)
	if rep := f.audit(); !rep.Balanced {
		t.Fatalf("audit = %+v", rep)
	}
}

// TestClaimOfAFinishedPayoutIsFinishedWhateverItsFence: a forged maximum
// token claimed and posted a payout; the executors' later claims,
// with real (lower) tokens, are told PAYOUT_FINISHED, which ends their
// delivery, not FENCED_OUT, which they redelivered forever.
func TestClaimOfAFinishedPayoutIsFinishedWhateverItsFence(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 1_000)
	f.createPayout("p-x", "acct-1", 1, "EUR")
	const forged = int64(9223372036854775807)
	st, body := f.claim("p-x", forged, "x")
	want(t, "claim with the forged token", st, body, http.StatusOK, "")
	st, body = f.result("p-x", forged, "x", "ACK", "rail-x")
	want(t, "ACK with the forged token", st, body, http.StatusOK, "")
	before := f.snapshot()
	for _, tok := range []int64{1, 5, forged} {
		st, body = f.claim("p-x", tok, "executor")
		want(t, fmt.Sprintf("claim of the finished payout with %d", tok), st, body, http.StatusConflict, api.CodePayoutFinished)
	}
	if f.snapshot() != before {
		t.Fatal("a refused claim changed paydb")
	}
}

// TestReclaimsDoNotGrowTheHistory: fifty redeliveries, each a new holder
// re-claiming with a newer token, leave one claimed -> claimed row that
// counts them and shows the latest holder; the same grant claiming again
// adds nothing. The log keeps the trail: the first claim at DEBUG (the
// posting restates it), every claim of the claimed payout at INFO.
func TestReclaimsDoNotGrowTheHistory(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 1_000)
	f.createPayout("p-1", "acct-1", 100, "EUR")
	for tok := int64(1); tok <= 50; tok++ {
		for range 2 { // the same grant asks twice (a lost answer)
			st, body := f.claim("p-1", tok, "w-"+strconv.FormatInt(tok, 10))
			want(t, fmt.Sprintf("claim with %d", tok), st, body, http.StatusOK, "")
		}
	}
	h := f.payout("p-1").History
	if len(h) != 3 {
		t.Fatalf("history has %d rows after 50 claims: %+v; want 3 (created, claimed, one re-claim row)", len(h), h)
	}
	if h[1].To != api.StateClaimed || h[1].Token != 1 || h[1].Claims != 0 {
		t.Errorf("first claim row %+v; want pending -> claimed with token 1", h[1])
	}
	if r := h[2]; r.From != api.StateClaimed || r.To != api.StateClaimed || r.Token != 50 || r.OwnerID != "w-50" || r.Claims != 49 {
		t.Errorf("re-claim row %+v; want claimed -> claimed, token 50, owner w-50, 49 claims", r)
	}
	claims := f.logs.Events(t, api.EventPayoutClaimed)
	if len(claims) != 100 || claims[0]["level"] != "DEBUG" {
		t.Fatalf("%d payout_claimed lines, the first %v; want 100, the first at DEBUG", len(claims), claims[0:min(1, len(claims))])
	}
	for _, c := range claims[1:] {
		if c["level"] != "INFO" {
			t.Fatalf("re-claim line %v; want INFO", c)
		}
	}
	st, body := f.result("p-1", 50, "w-50", "ACK", "rail-1")
	want(t, "ACK", st, body, http.StatusOK, "")
	if h := f.payout("p-1").History; len(h) != 5 {
		t.Fatalf("history after the post: %d rows; want 5", len(h))
	}
}

// TestOwnerHeaderIsHeldToLockServersRule: an
// X-Lock-Owner that lock-server would not grant a lease to (invalid
// UTF-8, a control character, a valid UTF-8 id longer than 128 bytes
// that a cut would split mid-character, a repeated header) is refused 400
// INVALID_REQUEST at every holder route, changes nothing, and no answer
// carries PostgreSQL's text.
func TestOwnerHeaderIsHeldToLockServersRule(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 1_000)
	f.createPayout("p-1", "acct-1", 100, "EUR")
	st, body := f.claim("p-1", 5, "w")
	want(t, "claim", st, body, http.StatusOK, "")
	before := f.snapshot()
	owners := map[string][]string{
		"invalid UTF-8":              {"\xff"},
		"a control character":        {"a\x01b"},
		"130 bytes of é":             {strings.Repeat("é", 65)},
		"129 ASCII bytes":            {strings.Repeat("a", 129)},
		"a space":                    {"a b"},
		"the header twice":           {"a", "b"},
		"an empty header":            {""},
		"valid UTF-8, not lock-safe": {"wörker"},
	}
	for name, vals := range owners {
		for _, route := range []struct{ path, body string }{
			{api.ClaimPath("p-1"), ""},
			{api.ResultPath("p-1"), `{"outcome":"ACK","railRef":"r-1"}`},
			{api.AttentionPath("p-1"), `{"reason":"rail_ref_conflict"}`},
		} {
			headers := []string{fencewire.HeaderToken, "6"}
			for _, v := range vals {
				headers = append(headers, fencewire.HeaderOwner, v)
			}
			st, body := f.do("POST", route.path, route.body, headers...)
			want(t, name+" at "+route.path, st, body, http.StatusBadRequest, api.CodeInvalidRequest)
			if bytes.Contains(body, []byte("SQLSTATE")) || bytes.Contains(body, []byte("\xff")) {
				t.Errorf("%s at %s: body %q carries internal or raw text", name, route.path, body)
			}
		}
	}
	if f.snapshot() != before {
		t.Fatal("a refused owner changed paydb")
	}
	ok := strings.Repeat("a", api.MaxOwnerLen)
	st, body = f.claim("p-1", 6, ok)
	want(t, "an owner of exactly 128 bytes", st, body, http.StatusOK, "")
}

// TestServerErrorsCarryNoInternalText: with paydb gone, the 5xx answer
// says what the caller may do, never the driver's error (which names the
// socket); the cause is in the log.
func TestServerErrorsCarryNoInternalText(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 1_000)
	f.svc.Close() // closes the pool: every query fails
	for _, r := range []struct{ method, path, body string }{
		{"GET", api.PayoutPath("p-1"), ""},
		{"GET", api.AccountPath("acct-1"), ""},
		{"POST", api.ClaimPath("p-1"), ""},
	} {
		st, body := f.do(r.method, r.path, r.body, fencewire.HeaderToken, "5")
		if st < 500 {
			t.Fatalf("%s %s with paydb closed: %d %s; want a 5xx", r.method, r.path, st, body)
		}
		env := decode[api.ErrorEnvelope](t, body)
		for _, leak := range []string{"pool", "closed", "SQLSTATE", "127.0.0.1", "paymentresource:"} {
			if strings.Contains(env.Error.Message, leak) {
				t.Errorf("%s %s: message %q carries %q", r.method, r.path, env.Error.Message, leak)
			}
		}
	}
	if lines := f.logs.Events(t, api.EventRequestFailed); len(lines) == 0 || lines[0]["error"] == "" {
		t.Fatalf("request_failed lines %v; want the cause logged", lines)
	}
}
