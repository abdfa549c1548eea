package paymentresource_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
)

// A payout's createdAt and updatedAt are its first and last history rows'
// times, at every step: the newcomer's probe 15 found updatedAt (the
// transaction's start) earlier than the history row written in the same
// transaction.
func TestUpdatedAtIsTheLastHistoryRowsTime(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 10_000)
	f.createAccount("acct-2", "EUR", 10_000)
	check := func(step, id string) {
		t.Helper()
		p := f.payout(id)
		if len(p.History) == 0 {
			t.Fatalf("%s: %s has no history", step, id)
		}
		first, last := p.History[0], p.History[len(p.History)-1]
		if !p.CreatedAt.Equal(first.At) {
			t.Errorf("%s: createdAt %v, first history row at %v", step, p.CreatedAt, first.At)
		}
		if !p.UpdatedAt.Equal(last.At) {
			t.Errorf("%s: updatedAt %v, last history row (%s -> %s) at %v", step, p.UpdatedAt, last.From, last.To, last.At)
		}
	}
	f.createPayout("p-1", "acct-1", 100, "EUR")
	check("created", "p-1")
	for _, tok := range []int64{5, 5, 6, 7} { // the same token, then two re-claims folded into one row
		st, body := f.claim("p-1", tok, "w")
		want(t, "claim", st, body, http.StatusOK, "")
		check("claimed", "p-1")
	}
	st, body := f.result("p-1", 7, "w", "ACK", "rail-1")
	want(t, "ACK", st, body, http.StatusOK, "")
	check("posted", "p-1")

	f.createPayout("p-2", "acct-2", 100, "EUR")
	st, body = f.claim("p-2", 3, "w")
	want(t, "claim p-2", st, body, http.StatusOK, "")
	st, body = f.attention("p-2", 3, "w", string(api.ReasonRailRefConflict))
	want(t, "attention p-2", st, body, http.StatusOK, "")
	check("needs attention", "p-2")
	st, body = f.result("p-2", 4, "w", "AMBIGUOUS", "")
	want(t, "ambiguous p-2", st, body, http.StatusOK, "")
	check("ambiguous", "p-2")
	st, body = f.result("p-2", 4, "w", "DECLINE", "rail-2")
	want(t, "decline p-2", st, body, http.StatusOK, "")
	check("declined", "p-2")
}

// A stale holder re-posting the identical ACK (same rail reference and
// outcome) gets 200 and changes nothing: results are facts keyed by the
// rail reference (docs/payout-api.md, the newcomer's probe 4).
func TestStaleHolderReplayingTheSameAckChangesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 10_000)
	f.createPayout("p-1", "acct-1", 100, "EUR")
	st, body := f.claim("p-1", 5, "stale")
	want(t, "claim by the stale holder", st, body, http.StatusOK, "")
	st, body = f.claim("p-1", 7, "current")
	want(t, "claim by the current holder", st, body, http.StatusOK, "")
	st, body = f.result("p-1", 7, "current", "ACK", "rail-1")
	want(t, "ACK by the current holder", st, body, http.StatusOK, "")
	before := f.snapshot()
	st, body = f.result("p-1", 5, "stale", "ACK", "rail-1")
	want(t, "the same ACK by the stale holder", st, body, http.StatusOK, "")
	if after := f.snapshot(); after != before {
		t.Errorf("a replayed ACK changed paydb:\nbefore %s\nafter  %s", before, after)
	}
	st, body = f.result("p-1", 5, "stale", "ACK", "rail-2")
	want(t, "another ACK by the stale holder", st, body, http.StatusConflict, "")
}

// A payout's answers carry its history only when asked: without
// ?include=history the field is absent (and not read), with it the rows
// are there, and another value of include is refused.
func TestHistoryOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 10_000)
	if p := f.createPayout("p-1", "acct-1", 100, "EUR"); p.History != nil {
		t.Errorf("create without include: history %+v; want none", p.History)
	}
	st, body := f.claim("p-1", 5, "w")
	want(t, "claim", st, body, http.StatusOK, "")
	if strings.Contains(string(body), `"history"`) {
		t.Errorf("claim without include answered a history: %s", body)
	}
	st, body = f.do("GET", api.PayoutPath("p-1"), "")
	want(t, "get", st, body, http.StatusOK, "")
	if strings.Contains(string(body), `"history"`) {
		t.Errorf("get without include answered a history: %s", body)
	}
	st, body = f.do("POST", api.WithHistory(api.ClaimPath("p-1")), "", fencewire.HeaderToken, "6", fencewire.HeaderOwner, "w")
	want(t, "claim with include=history", st, body, http.StatusOK, "")
	if h := decode[api.Payout](t, body).History; len(h) != 3 || h[2].To != api.StateClaimed || h[2].Token != 6 {
		t.Errorf("claim with include=history: history %+v; want the creation, the claim and the re-claim by token 6", h)
	}
	st, body = f.do("GET", api.PayoutPath("p-1")+"?include=everything", "")
	want(t, "include=everything", st, body, http.StatusBadRequest, api.CodeInvalidRequest)
}
