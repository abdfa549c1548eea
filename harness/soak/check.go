package soak

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutaudit"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
)

// Records is what the soak judges a run by, read after it settled from
// the parts' own records: paydb, raildb and the rail-stub's journal.
type Records struct {
	// Expected lists the id of every payout the run created.
	Expected []string
	// Payouts is every payout of the run in paydb.
	Payouts []PayoutRecord
	// Journal is the rail-stub's journal: every submission the rail
	// received (GET /submissions).
	Journal []rail.Submission
	// Debits counts the ledger debit transactions of each payout (paydb
	// ledger_txn).
	Debits map[string]int
	// Audit is payoutaudit.Run over the journal, raildb and paydb (with
	// the ledger's own audit).
	Audit payoutaudit.Report
	// Finished lists when each payout reached posted, declined or failed
	// (paydb's payout_transition, the database's clock), in time order.
	Finished []Finish
	// Paths counts the transitions into declined, failed and
	// needs_attention by "from->to" (how those payouts got there).
	Paths map[string]int
}

// PayoutRecord is one payout as paydb holds it.
type PayoutRecord struct {
	ID     string `json:"payoutId"`
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// History is its transitions, "from->to token owner [reason]", for
	// the payouts a person must look at.
	History []string `json:"history,omitempty"`
}

// Finish is one payout reaching a final state.
type Finish struct {
	PayoutID string
	State    string
	At       time.Time
}

// Names of the four checks, as they start each line of Check's result.
const (
	CheckNoneLost       = "no payout lost"
	CheckRailOnce       = "no payout reached the rail twice"
	CheckLedgerBalances = "the ledger balances"
	CheckOneDebit       = "every rail payment has exactly one debit"
)

// final reports whether a payout in state s has ended for the pipeline:
// posted, declined or failed; or needs_attention, a person's queue (it
// must carry its reason).
func final(s string) bool {
	switch api.State(s) {
	case api.StatePosted, api.StateDeclined, api.StateFailed, api.StateNeedsAttention:
		return true
	}
	return false
}

// Check judges r and returns one line per broken rule, each starting with
// the name of its check (CheckNoneLost, CheckRailOnce,
// CheckLedgerBalances, CheckOneDebit); empty when all four hold.
//
//   - No payout lost: every expected payout is in paydb and ended posted,
//     declined or failed, or waits in needs_attention with its reason.
//   - No payout reached the rail twice: at most one submission per payout
//     in the rail's journal.
//   - The ledger balances: payoutaudit finds no violation (the ledger's
//     own rules and the cross-record rules).
//   - Every rail payment has exactly one debit: a payout the rail
//     acknowledged has one ledger debit, any other payout none, and a
//     posted payout was acknowledged by the rail.
func Check(r Records) []string {
	out := []string{}
	byID := map[string]PayoutRecord{}
	for _, p := range r.Payouts {
		byID[p.ID] = p
	}
	for _, id := range r.Expected {
		p, ok := byID[id]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("%s: payout %s is not in paydb", CheckNoneLost, id))
		case !final(p.State):
			out = append(out, fmt.Sprintf("%s: payout %s was left %s", CheckNoneLost, id, p.State))
		case api.State(p.State) == api.StateNeedsAttention && p.Reason == "":
			out = append(out, fmt.Sprintf("%s: payout %s needs attention without a reason", CheckNoneLost, id))
		}
	}
	atRail, acks := map[string]int{}, map[string]int{}
	for _, s := range r.Journal {
		if s.Stop {
			continue // a stop order (the reconciler's), not a payment
		}
		atRail[s.Request.PayoutID]++
		if s.Answer.Status == rail.StatusAck {
			acks[s.Request.PayoutID]++
		}
	}
	for _, id := range sortedKeys(atRail) {
		if atRail[id] > 1 {
			out = append(out, fmt.Sprintf("%s: payout %s reached the rail %d times", CheckRailOnce, id, atRail[id]))
		}
	}
	if !r.Audit.Balanced {
		for _, v := range r.Audit.Violations {
			out = append(out, fmt.Sprintf("%s: %s", CheckLedgerBalances, v))
		}
		if len(r.Audit.Violations) == 0 {
			out = append(out, CheckLedgerBalances+": the audit reports unbalanced books without a violation")
		}
	}
	ids := map[string]bool{}
	for id := range acks {
		ids[id] = true
	}
	for id, n := range r.Debits {
		if n > 0 {
			ids[id] = true
		}
	}
	for _, p := range r.Payouts {
		if api.State(p.State) == api.StatePosted {
			ids[p.ID] = true
		}
	}
	for _, id := range sortedKeys(ids) {
		a, d := acks[id], r.Debits[id]
		switch {
		case a != d && a > 0:
			out = append(out, fmt.Sprintf("%s: payout %s: the rail paid it %d times, the ledger debits it %d times", CheckOneDebit, id, a, d))
		case a != d:
			out = append(out, fmt.Sprintf("%s: payout %s: %d debits and no payment at the rail", CheckOneDebit, id, d))
		case a == 0 && api.State(byID[id].State) == api.StatePosted:
			out = append(out, fmt.Sprintf("%s: payout %s is posted and the rail never paid it", CheckOneDebit, id))
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// readRecords reads the records of a settled run.
func readRecords(ctx context.Context, ld *loader) (Records, error) {
	var r Records
	for _, p := range ld.plan.payouts {
		r.Expected = append(r.Expected, p.id)
	}
	paydb := ld.d.PayDB

	rows, err := paydb.Query(ctx, `SELECT payout_id, state, coalesce(attention_reason, '') FROM payout WHERE payout_id LIKE 'soak-%' ORDER BY payout_id`)
	if err != nil {
		return r, err
	}
	for rows.Next() {
		var p PayoutRecord
		if err := rows.Scan(&p.ID, &p.State, &p.Reason); err != nil {
			rows.Close()
			return r, err
		}
		r.Payouts = append(r.Payouts, p)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return r, err
	}
	for i, p := range r.Payouts {
		if p.State == string(api.StatePosted) || p.State == string(api.StateDeclined) || p.State == string(api.StateFailed) {
			continue
		}
		h, err := history(ctx, paydb, p.ID)
		if err != nil {
			return r, err
		}
		r.Payouts[i].History = h
	}

	r.Debits = map[string]int{}
	rows, err = paydb.Query(ctx, `SELECT payout_id, count(*) FROM ledger_txn WHERE kind = 'payout_debit' GROUP BY payout_id`)
	if err != nil {
		return r, err
	}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			rows.Close()
			return r, err
		}
		r.Debits[id] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return r, err
	}

	rows, err = paydb.Query(ctx, `SELECT payout_id, to_state, at FROM payout_transition
		WHERE payout_id LIKE 'soak-%' AND to_state IN ('posted', 'declined', 'failed') ORDER BY at`)
	if err != nil {
		return r, err
	}
	for rows.Next() {
		var f Finish
		if err := rows.Scan(&f.PayoutID, &f.State, &f.At); err != nil {
			rows.Close()
			return r, err
		}
		r.Finished = append(r.Finished, f)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return r, err
	}

	r.Paths = map[string]int{}
	rows, err = paydb.Query(ctx, `SELECT coalesce(from_state, '-') || '->' || to_state, count(*) FROM payout_transition
		WHERE payout_id LIKE 'soak-%' AND to_state IN ('declined', 'failed', 'needs_attention') GROUP BY 1`)
	if err != nil {
		return r, err
	}
	for rows.Next() {
		var path string
		var n int
		if err := rows.Scan(&path, &n); err != nil {
			rows.Close()
			return r, err
		}
		r.Paths[path] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return r, err
	}

	a, err := ld.d.Audit(ctx)
	if err != nil {
		return r, err
	}
	r.Journal, r.Audit = a.Journal, a.Report
	return r, nil
}

// history returns a payout's transitions, one line each.
func history(ctx context.Context, paydb *pgxpool.Pool, id string) ([]string, error) {
	rows, err := paydb.Query(ctx, `SELECT coalesce(from_state, '-'), to_state, coalesce(token, 0), coalesce(owner_id, '-'), coalesce(reason, '')
		FROM payout_transition WHERE payout_id = $1 ORDER BY transition_id`, id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var from, to, owner, reason string
		var token int64
		if err := rows.Scan(&from, &to, &token, &owner, &reason); err != nil {
			return nil, err
		}
		line := fmt.Sprintf("%s->%s token %d owner %s", from, to, token, owner)
		if reason != "" {
			line += " reason " + reason
		}
		out = append(out, line)
	}
	return out, rows.Err()
}
