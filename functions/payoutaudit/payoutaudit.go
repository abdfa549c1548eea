// Package payoutaudit checks the payout pipeline end to end, from the three
// records that each see a different part of the money: the rail's own
// journal (what the rail received and answered), raildb (what rail-proxy
// let through, with which token) and paydb (what the books say).
//
// paydb alone can balance while money left twice: when a second
// submission of a payout reaches the rail and its report is refused by
// payment-resource's fence, the ledger holds one debit for one posted
// payout and every rule of ledgeraudit.Run holds. Only the rail's
// record shows the second payment. This audit is therefore judged from the
// rail's journal first (INV-04, INV-05 of docs/correctness.md), never from
// what workers reported.
package payoutaudit

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/ledgeraudit"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
)

// Names of the cross-record checks, as reported in Violation.Check.
const (
	// CheckRailOnce (INV-04): the rail received at most one submission per
	// payout.
	CheckRailOnce = "rail_at_most_once_per_payout"
	// CheckRailMatchesLedger (INV-05): a payout has one ledger debit if the
	// rail acknowledged it, and none otherwise. A payout still waiting
	// for its outcome (claimed, ambiguous) is reported in Unreconciled
	// instead.
	CheckRailMatchesLedger = "rail_acks_match_ledger_debits"
	// CheckRailThroughProxy: every submission the rail received was let
	// through by rail-proxy: the payout has at least as many forwarded
	// attempts in raildb as submissions at the rail, and every rail
	// reference of an answered attempt is in the rail's journal.
	CheckRailThroughProxy = "rail_submissions_went_through_rail_proxy"
	// CheckRailToken: a posted or declined payout records the token of
	// the rail-proxy attempt that carries its rail reference (or, when
	// raildb never recorded the rail's answer, of the payout's one
	// forwarded attempt).
	CheckRailToken = "payout_records_the_token_that_reached_the_rail"
	// CheckRailPaidThePayout: every submission the rail received under a
	// payout's id names the payout's account, amount and currency, as
	// paydb has them.
	CheckRailPaidThePayout = "rail_paid_what_paydb_booked"
)

// Violation is one broken rule.
type Violation struct {
	// Check is one of the Check constants, or a check of
	// ledgeraudit.Run.
	Check string `json:"check"`
	// Subject is the payout id (or what the ledger check names).
	Subject string `json:"subject"`
	// Detail says what was found.
	Detail string `json:"detail"`
}

// String describes v in one line.
func (v Violation) String() string { return v.Check + " " + v.Subject + ": " + v.Detail }

// Report is the result of Run.
type Report struct {
	// Balanced is true when there are no violations, in the ledger or
	// across the records.
	Balanced bool `json:"balanced"`
	// Violations lists every broken rule, never nil.
	Violations []Violation `json:"violations"`
	// Unreconciled lists the payouts whose records do not yet agree
	// although no rule is broken: an ambiguous payout, one the rail
	// received with no outcome recorded yet in paydb (money may have moved
	// without a debit), or one whose answer raildb never recorded (its
	// forward stays 'forwarding'). A reconciliation with the rail's
	// journal settles them. Never nil.
	Unreconciled []string `json:"unreconciled"`
	// RailPaidNoDebit lists the payouts the rail acknowledged more often
	// than paydb debited them (money left, no debit: a rail payment with
	// no debit), and DebitNoRailPayment those paydb debited more often
	// than the rail acknowledged (a debit with no rail payment). Each is
	// also a violation of CheckRailMatchesLedger, except a payout still
	// waiting for its outcome (pending, claimed, ambiguous), which is in
	// Unreconciled. Never nil.
	RailPaidNoDebit    []string `json:"railPaidNoDebit"`
	DebitNoRailPayment []string `json:"debitNoRailPayment"`
	// InFlight lists the payouts Live's first look flagged (the rail's
	// record ahead of the books) and its second look found agreeing: in
	// flight, not reported. Never nil.
	InFlight []string `json:"inFlight"`
	// Payouts counts the payouts checked; RailSubmissions and RailAcks
	// the rail's records of them; Debits their ledger debits.
	Payouts         int `json:"payouts"`
	RailSubmissions int `json:"railSubmissions"`
	RailAcks        int `json:"railAcks"`
	Debits          int `json:"debits"`
	// Ledger is ledgeraudit.Run's report, when Run checked every
	// payout (nil for a scoped check).
	Ledger *api.AuditReport `json:"ledger,omitempty"`
}

// payoutFacts is what each record says about one payout.
type payoutFacts struct {
	// from paydb
	inPaydb   bool
	state     string
	railRef   string
	railToken int64
	debits    int
	account   string
	amount    int64
	currency  string
	// from raildb: attempts that went (or may have gone) to the rail
	forwarded    int
	tokenByRef   map[string]int64
	refsAnswered []string
	rebuiltRefs  []string      // attempts rebuilt from the rail's journal after a restore: token at most theirs
	firstToken   int64         // the payout's one forward (rail_payout), 0 if none
	firstState   railapi.State // its state
	// from the rail's journal
	rail, acks int
	railRefs   []string
	paid       []rail.SubmitRequest
}

// DefaultSettle is Live's default wait between its two looks (2 s): far
// more than the time from the rail's answer to the executor's post
// through rail-proxy and payment-resource in a healthy pipeline (tens of
// milliseconds), and short enough for a reconciler pass. A payout whose
// post takes longer is still in flight at the second look and is
// reported; the next audit, which finds it posted, clears it.
const DefaultSettle = 2 * time.Second

// RailReader reads the rail's own record (railstub.Stub.Submissions, or
// GET /submissions of a rail-stub process): every payment it holds, at
// least those of the payouts audited; stop orders are skipped if present.
// Its error is returned by Live, wrapped.
type RailReader func(ctx context.Context) ([]rail.Submission, error)

// LiveConfig configures Live. The zero value waits DefaultSettle.
type LiveConfig struct {
	// Settle is the wait before the second look (0: DefaultSettle; see
	// DefaultSettle for its bound). Must not be negative.
	Settle time.Duration
	// Settled, when set, is called instead of the Settle wait and returns
	// when the second look may start (a test holds it on a hook; an error
	// ends Live with it).
	Settled func(ctx context.Context) error
}

// Live checks the records like Run, beside live traffic (the reconciler's
// audit after each pass), and never reports a disagreement that is only a
// payout in flight, without hiding a persistent one. It reads against the
// pipeline's causal order of writes (paydb first, raildb second, the rail's
// journal last), so a debit's rail payment, and a recorded reference, is
// always found; the findings no order can make safe (a rail payment ahead
// of its debit or forward) get a second look after cfg.Settle, and are
// reported only when found again (the payouts that were in flight go to
// InFlight). The ledger audit (ledgeraudit.Run, when payoutIDs is
// nil) is one paydb snapshot, reported as is. Counts and Unreconciled are
// the first look's. The error is a database's or the rail reader's. The
// argument: docs/correctness.md, "The cross audit beside live traffic".
func Live(ctx context.Context, paydb, raildb *pgxpool.Pool, readRail RailReader, payoutIDs []string, cfg LiveConfig) (Report, error) {
	if cfg.Settle < 0 {
		return newReport(), fmt.Errorf("payoutaudit: negative settle %v", cfg.Settle)
	}
	look := func(ids []string) (Report, []bool, error) {
		fs, err := readBooks(ctx, paydb, raildb, ids)
		if err != nil {
			return Report{}, nil, err
		}
		journal, err := readRail(ctx)
		if err != nil {
			return Report{}, nil, fmt.Errorf("payoutaudit: read the rail's record: %w", err)
		}
		fs.addRail(journal, ids)
		rep, ahead := judge(fs)
		return rep, ahead, nil
	}
	rep, ahead, err := look(payoutIDs)
	if err != nil {
		return newReport(), err
	}
	var suspects []string
	for i, v := range rep.Violations {
		if ahead[i] && !slices.Contains(suspects, v.Subject) {
			suspects = append(suspects, v.Subject)
		}
	}
	for _, id := range rep.RailPaidNoDebit {
		if !slices.Contains(suspects, id) {
			suspects = append(suspects, id)
		}
	}
	if len(suspects) > 0 {
		slices.Sort(suspects)
		if cfg.Settled != nil {
			err = cfg.Settled(ctx)
		} else {
			err = wait(ctx, cmp.Or(cfg.Settle, DefaultSettle))
		}
		if err != nil {
			return newReport(), fmt.Errorf("payoutaudit: settle: %w", err)
		}
		again, aheadAgain, err := look(suspects)
		if err != nil {
			return newReport(), err
		}
		persists := func(v Violation) bool {
			for i, w := range again.Violations {
				if aheadAgain[i] && w.Check == v.Check && w.Subject == v.Subject {
					return true
				}
			}
			return false
		}
		kept := []Violation{}
		for i, v := range rep.Violations {
			if !ahead[i] || persists(v) {
				kept = append(kept, v)
			}
		}
		rep.Violations = kept
		paid := []string{}
		for _, id := range rep.RailPaidNoDebit {
			if slices.Contains(again.RailPaidNoDebit, id) {
				paid = append(paid, id)
			}
		}
		rep.RailPaidNoDebit = paid
		for _, id := range suspects {
			flagged := slices.Contains(rep.RailPaidNoDebit, id) || slices.ContainsFunc(rep.Violations, func(v Violation) bool { return v.Subject == id })
			if !flagged {
				rep.InFlight = append(rep.InFlight, id)
			}
		}
		rep.Unreconciled = slices.DeleteFunc(rep.Unreconciled, func(id string) bool { return slices.Contains(rep.InFlight, id) })
	}
	return withLedger(ctx, paydb, rep, payoutIDs)
}

// wait blocks for d or until ctx ends.
func wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// facts is what the records say, per payout id.
type facts map[string]*payoutFacts

func (fs facts) get(id string) *payoutFacts {
	f := fs[id]
	if f == nil {
		f = &payoutFacts{tokenByRef: map[string]int64{}}
		fs[id] = f
	}
	return f
}

// Run checks the payouts named in payoutIDs (every payout of paydb, and
// every payout the rail or raildb knows, when payoutIDs is nil) against
// the rail's journal rail (railstub.Stub.Submissions, or GET /submissions
// of a rail-stub process: every record, not only those of payoutIDs),
// raildb and paydb. When payoutIDs is nil it also runs
// ledgeraudit.Run over paydb and includes its violations.
//
// The rail's journal was read by the caller, before the databases: run
// it when the pipeline is quiet (no payout in flight), as the experiment,
// the soak's final check and the tests do. Beside live traffic use Live,
// which reads the records in the pipeline's causal order and gives a
// second look to what only a payout in flight can explain. Broken rules
// are reported in the Report; the error is a database's.
func Run(ctx context.Context, paydb, raildb *pgxpool.Pool, journal []rail.Submission, payoutIDs []string) (Report, error) {
	fs, err := readBooks(ctx, paydb, raildb, payoutIDs)
	if err != nil {
		return newReport(), err
	}
	fs.addRail(journal, payoutIDs)
	rep, _ := judge(fs)
	return withLedger(ctx, paydb, rep, payoutIDs)
}

func newReport() Report {
	return Report{Violations: []Violation{}, Unreconciled: []string{}, RailPaidNoDebit: []string{}, DebitNoRailPayment: []string{}, InFlight: []string{}}
}

// withLedger adds ledgeraudit.Run's report and violations to rep
// when payoutIDs is nil, and sets Balanced.
func withLedger(ctx context.Context, paydb *pgxpool.Pool, rep Report, payoutIDs []string) (Report, error) {
	if payoutIDs == nil {
		ledger, err := ledgeraudit.Run(ctx, paydb)
		if err != nil {
			return rep, fmt.Errorf("payoutaudit: %w", err)
		}
		rep.Ledger = &ledger
		for _, v := range ledger.Violations {
			rep.Violations = append(rep.Violations, Violation{v.Check, v.Subject, v.Detail})
		}
	}
	rep.Balanced = len(rep.Violations) == 0
	return rep, nil
}

// readBooks reads what paydb, then raildb, say of payoutIDs (all when
// nil).
func readBooks(ctx context.Context, paydb, raildb *pgxpool.Pool, payoutIDs []string) (facts, error) {
	fs := facts{}
	rows, err := paydb.Query(ctx, `SELECT p.payout_id, p.state, coalesce(p.rail_ref, ''), coalesce(p.rail_token, 0),
       (SELECT count(*) FROM ledger_txn t WHERE t.payout_id = p.payout_id AND t.kind = 'payout_debit'),
       p.account_id, p.amount_minor, p.currency
  FROM payout p WHERE $1::text[] IS NULL OR p.payout_id = ANY($1::text[])`, payoutIDs)
	if err != nil {
		return nil, fmt.Errorf("payoutaudit: paydb: %w", err)
	}
	var (
		id, state, ref, acct, ccy string
		tok, amount               int64
		debits                    int
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &state, &ref, &tok, &debits, &acct, &amount, &ccy}, func() error {
		f := fs.get(id)
		f.inPaydb, f.state, f.railRef, f.railToken, f.debits = true, state, ref, tok, debits
		f.account, f.amount, f.currency = acct, amount, ccy
		return nil
	}); err != nil {
		return nil, fmt.Errorf("payoutaudit: paydb: %w", err)
	}

	rows, err = raildb.Query(ctx, `SELECT payout_id, token, state, coalesce(rail_ref, ''), owner_id FROM rail_attempt
 WHERE state NOT IN ($2, $3) AND ($1::text[] IS NULL OR payout_id = ANY($1::text[]))`,
		payoutIDs, railapi.StateFenced, railapi.StateDuplicate)
	if err != nil {
		return nil, fmt.Errorf("payoutaudit: raildb: %w", err)
	}
	var owner string
	if _, err := pgx.ForEachRow(rows, []any{&id, &tok, &state, &ref, &owner}, func() error {
		f := fs.get(id)
		f.forwarded++
		if ref != "" {
			f.tokenByRef[ref] = tok
			f.refsAnswered = append(f.refsAnswered, ref)
			if owner == railapi.RebuiltOwner {
				f.rebuiltRefs = append(f.rebuiltRefs, ref)
			}
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("payoutaudit: raildb: %w", err)
	}

	rows, err = raildb.Query(ctx, `SELECT p.payout_id, a.token, a.state FROM rail_payout p JOIN rail_attempt a USING (attempt_id)
 WHERE $1::text[] IS NULL OR p.payout_id = ANY($1::text[])`, payoutIDs)
	if err != nil {
		return nil, fmt.Errorf("payoutaudit: raildb: %w", err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&id, &tok, &state}, func() error {
		f := fs.get(id)
		f.firstToken, f.firstState = tok, railapi.State(state)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("payoutaudit: raildb: %w", err)
	}
	return fs, nil
}

// addRail adds the rail's records of payoutIDs (all when nil) to fs.
func (fs facts) addRail(journal []rail.Submission, payoutIDs []string) {
	for _, s := range journal {
		if s.Stop || payoutIDs != nil && !slices.Contains(payoutIDs, s.Request.PayoutID) {
			continue
		}
		f := fs.get(s.Request.PayoutID)
		f.rail++
		f.railRefs = append(f.railRefs, s.Answer.RailRef)
		f.paid = append(f.paid, s.Request)
		if s.Answer.Status == rail.StatusAck {
			f.acks++
		}
	}
}

// judge applies the cross-record rules to fs. The Report has no ledger
// part and Balanced unset. ahead[i] is true when Violations[i] is a
// record of the rail (or of a forward) that the books, read before it,
// may not show yet because the payout was in flight (see Live); every
// payout of RailPaidNoDebit is such a finding too.
func judge(fs facts) (rep Report, ahead []bool) {
	rep = newReport()
	ids := make([]string, 0, len(fs))
	for id := range fs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	add := func(check, subject, format string, args ...any) {
		rep.Violations = append(rep.Violations, Violation{check, subject, fmt.Sprintf(format, args...)})
		ahead = append(ahead, false)
	}
	addAhead := func(check, subject, format string, args ...any) {
		add(check, subject, format, args...)
		ahead[len(ahead)-1] = true
	}
	for _, id := range ids {
		f := fs[id]
		if f.inPaydb {
			rep.Payouts++
		}
		rep.RailSubmissions += f.rail
		rep.RailAcks += f.acks
		rep.Debits += f.debits
		switch {
		case f.acks > f.debits:
			rep.RailPaidNoDebit = append(rep.RailPaidNoDebit, id)
		case f.debits > f.acks:
			rep.DebitNoRailPayment = append(rep.DebitNoRailPayment, id)
		}
		if f.rail > 1 {
			add(CheckRailOnce, id, "the rail received %d submissions (%d acknowledged); paydb has %d debit(s)", f.rail, f.acks, f.debits)
		}
		if f.rail > f.forwarded {
			addAhead(CheckRailThroughProxy, id, "the rail received %d submissions, rail-proxy forwarded %d", f.rail, f.forwarded)
		}
		for _, r := range f.refsAnswered {
			if !slices.Contains(f.railRefs, r) {
				add(CheckRailThroughProxy, id, "rail-proxy recorded rail reference %s, which the rail's journal does not hold", r)
			}
		}
		switch api.State(f.state) {
		case api.StateAmbiguous:
			// Its outcome is for the reconciliation to learn from the rail.
			rep.Unreconciled = append(rep.Unreconciled, id)
			if f.debits != 0 {
				add(CheckRailMatchesLedger, id, "an ambiguous payout has %d debit(s)", f.debits)
			}
		case api.StatePending, api.StateClaimed, api.StateSubmitted:
			// Nobody has reported an outcome yet (a delivery is still due).
			if f.acks > 0 {
				rep.Unreconciled = append(rep.Unreconciled, id)
			}
			if f.debits != 0 {
				add(CheckRailMatchesLedger, id, "a %s payout has %d debit(s)", f.state, f.debits)
			}
		case "":
			addAhead(CheckRailMatchesLedger, id, "the rail received %d submission(s) of a payout paydb does not know", f.rail)
		default:
			switch {
			case f.acks > f.debits:
				addAhead(CheckRailMatchesLedger, id, "the rail acknowledged %d submission(s), paydb has %d debit(s) (state %s)", f.acks, f.debits, f.state)
			case f.debits > f.acks:
				add(CheckRailMatchesLedger, id, "the rail acknowledged %d submission(s), paydb has %d debit(s) (state %s)", f.acks, f.debits, f.state)
			}
		}
		if f.inPaydb {
			for _, p := range f.paid {
				if p.AccountID != f.account || p.AmountMinor != f.amount || p.Currency != f.currency {
					add(CheckRailPaidThePayout, id, "the rail paid %d %s from %s; paydb's payout is %d %s from %s",
						p.AmountMinor, p.Currency, p.AccountID, f.amount, f.currency, f.account)
				}
			}
		}
		if f.inPaydb && f.railRef != "" && (f.state == string(api.StatePosted) || f.state == string(api.StateDeclined)) {
			want, ok := f.tokenByRef[f.railRef]
			if !ok && f.firstState == railapi.StateForwarding && slices.Contains(f.railRefs, f.railRef) {
				// The rail answered and paydb recorded it, but raildb never
				// learned the answer: its one forward stays 'forwarding'.
				want, ok = f.firstToken, true
				rep.Unreconciled = append(rep.Unreconciled, id)
			}
			rebuilt := slices.Contains(f.rebuiltRefs, f.railRef)
			if rebuilt && ok && f.railToken <= want {
				// raildb lost the real token in a restore; the rebuilt
				// attempt records the floor, which the real one is under.
				continue
			}
			if !ok || want != f.railToken {
				add(CheckRailToken, id, "paydb records rail token %d for %s; rail-proxy forwarded it with token %d (found: %v)", f.railToken, f.railRef, want, ok)
			}
		}
	}
	return rep, ahead
}
