package paymentresource

import (
	"context"
	"errors"
	"strings"
	"sync"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgerr"
	"github.com/jackc/pgx/v5"
)

// One round trip per accepted request. A creation, a first claim and a
// result from claimed are each sent to paydb as one batch of two
// statements, without BEGIN and COMMIT: pgx sends a batch's statements
// with a single Sync, so PostgreSQL runs them in one implicit transaction.
// The first statement locks the row the request is serialized on (the
// account for a creation, the payout otherwise), exactly as the
// transaction of the slow path does first; the second, in READ COMMITTED,
// takes its snapshot after that lock is held and makes every check of the
// slow path in SQL, writing only when all pass. Nothing runs in Go between
// the two, so what the slow path checks in Go against the locked row (the
// lock-server proof, rail-proxy's receipt, the claim's terms) is checked
// before the batch against the terms the request names, and the statement
// requires the row to hold exactly those terms. A payout's terms never
// change once created, so the proof and the receipt verified against them
// are verified against the row.
//
// Why the fast path accepts nothing the slow path refuses, whatever the
// order of concurrent requests: the payout row (claim, result) or the
// account row (creation) is locked before the statement's snapshot is
// taken, as in the slow path, so the statement sees the latest committed
// row and nobody changes it until the implicit commit; the balance a
// creation counts is read after the account lock, so two creations never
// count the same money; an ACK's debit is the strict fenced UPDATE of the
// account row, rechecked by PostgreSQL on the latest row version when it
// waits for that row, and it runs first: the payout's step, the history,
// the rail result and the ledger rows are written only from its RETURNING
// row, so a refused debit writes nothing; a DECLINE or AMBIGUOUS reads
// the account's fence from the statement's snapshot, as the slow path's
// step does, after the payout lock; the rail result (and the debit's
// ledger_txn) is a plain INSERT, and a reference recorded concurrently by
// another request fails it on the unique key, which rolls the whole batch
// back and sends the request to the slow path. Any case the
// statement does not accept (no row, a different state, a fence, a
// recorded rail reference, a terms mismatch, fencing off) writes nothing
// and is answered by the slow path's transaction, as before.

// lockAccountSQL and lockPayoutSQL are the first statement of a batch:
// the lock the slow path's transaction also takes first.
const (
	lockAccountSQL = `SELECT 1 FROM account WHERE account_id = $1 FOR UPDATE`
	lockPayoutSQL  = `SELECT 1 FROM payout WHERE payout_id = $1 FOR UPDATE`
)

// createPayoutFastSQL is createPayoutSQL that inserts only when account
// $2 has currency $4 and an available balance (availableBalance, here
// unclamped) of at least amount $3.
var createPayoutFastSQL = replaceOnce(createPayoutSQL, `WITH n AS (SELECT clock_timestamp() AS at),`,
	`WITH n AS (SELECT clock_timestamp() AS at FROM account a
  WHERE a.account_id = $2::text AND a.currency = $4::text
    AND $3::bigint <= a.balance_minor - coalesce((SELECT sum(q.amount_minor) FROM payout q
      WHERE q.account_id = a.account_id AND q.state NOT IN ('posted', 'declined', 'failed')), 0)),`)

// claimFastSQL is the first claim's step (claimStepFenced) of a pending
// payout whose terms are account $6, amount $7 and currency $8.
var claimFastSQL = step(claimFenced+`
  AND state = 'pending' AND account_id = $6 AND amount_minor = $7 AND currency = $8`, 4)

// The results of a claimed payout (fastResult).
var (
	postFastSQL      = fastResult(postFenced, api.OutcomeAck)
	declineFastSQL   = fastResult(declineFenced, api.OutcomeDecline)
	ambiguousFastSQL = fastResult(ambiguousFenced, api.OutcomeAmbiguous)
)

// fastResult returns the statement of a result from claimed: update is
// the fenced step (postFenced, declineFenced or ambiguousFenced, whose SET
// list it takes), parameters $1 payout, $2 token, $3 owner, $4 rail
// reference, $5 rail token, $6 and $7 the history's from and to states
// (as step), $8 account, $9 amount and $10 currency of the payout. It
// writes only when the payout is claimed with exactly these terms, its
// fence is at most the token and, for ACK and DECLINE, the rail reference
// is not recorded. An ACK then debits the account first (debitFenced,
// strict) and writes everything else only if the debit matched; DECLINE
// and AMBIGUOUS check the account's fence as the fenced step does. It
// returns payoutRowSQL's row, or no row when it wrote nothing.
func fastResult(update string, outcome api.Outcome) string {
	set, ok := strings.CutPrefix(update, "UPDATE payout SET ")
	set, _, ok2 := strings.Cut(set, "\nWHERE ")
	if !ok || !ok2 {
		panic("paymentresource: fastResult of a statement that is not a payout step: " + update)
	}
	debit, record := outcome == api.OutcomeAck, outcome != api.OutcomeAmbiguous
	var b strings.Builder
	b.WriteString(`WITH c AS (SELECT 1 FROM payout p
  WHERE p.payout_id = $1 AND p.state = 'claimed' AND p.fence <= $2
    AND p.account_id = $8 AND p.amount_minor = $9 AND p.currency = $10`)
	if record {
		b.WriteString(`
    AND NOT EXISTS (SELECT 1 FROM rail_result r WHERE r.rail_ref = $4)`)
	}
	gate := "c"
	if debit {
		b.WriteString(`),
d AS (UPDATE account SET balance_minor = balance_minor - $9, fence = $2
  WHERE account_id = $8 AND currency = $10 AND fence < $2 AND EXISTS (SELECT 1 FROM c)
  RETURNING account_id`)
		gate = "d"
	} else {
		b.WriteString(`
    AND $2 >= (SELECT a.fence FROM account a WHERE a.account_id = p.account_id)`)
	}
	b.WriteString(`),
u AS (UPDATE payout SET updated_at = clock_timestamp(), ` + set + `
  WHERE payout_id = $1 AND EXISTS (SELECT 1 FROM ` + gate + `)
  RETURNING payout_id, account_id, amount_minor, currency, state, fence, owner_id, rail_ref, rail_token, attention_reason, created_at, updated_at),
h AS (INSERT INTO payout_transition (payout_id, from_state, to_state, token, owner_id, at)
  SELECT u.payout_id, s.f, s.t, $2, u.owner_id, u.updated_at FROM u, unnest($6::text[], $7::text[]) WITH ORDINALITY AS s (f, t, i) ORDER BY s.i)`)
	if record {
		b.WriteString(`,
r AS (INSERT INTO rail_result (rail_ref, payout_id, outcome, token, owner_id, rail_token)
  SELECT $4, $1, '` + string(outcome) + `', $2, u.owner_id, $5 FROM u)`)
	}
	if debit {
		b.WriteString(`,
t AS (INSERT INTO ledger_txn (payout_id, kind, rail_ref, token) SELECT $1, '` + kindPayoutDebit + `', $4, $2 FROM u RETURNING txn_id),
e AS (INSERT INTO ledger_entry (txn_id, ledger_account, amount_minor, currency)
  SELECT t.txn_id, e.ledger_account, e.amount_minor, $10 FROM t,
    (VALUES ('` + ledgerAccountPrefix + `' || $8::text, -$9::bigint), ('` + ledgerRailClearing + `', $9::bigint)) AS e (ledger_account, amount_minor))`)
	}
	b.WriteString(`
SELECT payout_id, account_id, amount_minor, currency, state, fence,
       coalesce(owner_id, ''), coalesce(rail_ref, ''), coalesce(rail_token, 0), coalesce(attention_reason, ''),
       (SELECT count(*) FROM ledger_txn t WHERE t.payout_id = u.payout_id AND t.kind = '` + kindPayoutDebit + `'),
       created_at, updated_at
FROM u`)
	return b.String()
}

// replaceOnce returns s with old replaced by new, and panics when s does
// not contain old exactly once.
func replaceOnce(s, old, new string) string {
	if strings.Count(s, old) != 1 {
		panic("paymentresource: replaceOnce: want one " + old)
	}
	return strings.Replace(s, old, new, 1)
}

// lockedStep sends lock (with lockArg) and q (with args) as one batch,
// one implicit transaction, and returns q's payout row; ok is false when
// q returned no row or lost a race on a unique key (the batch then wrote
// nothing).
func (s *Service) lockedStep(ctx context.Context, op, lock string, lockArg any, q string, args ...any) (api.Payout, bool, error) {
	b := &pgx.Batch{}
	b.Queue(lock, lockArg)
	b.Queue(q, args...)
	br := s.pool.SendBatch(ctx, b)
	p, err := api.Payout{}, error(nil)
	if _, err = br.Exec(); err != nil {
		err = dbError(op+": lock", err)
	} else {
		p, err = scanPayoutRow(br.QueryRow(), "") // wraps its errors with dbError
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = dbError(op+": implicit commit", cerr)
	}
	switch {
	case errors.Is(err, ErrPayoutNotFound), pgerr.Is(err, pgerr.UniqueViolation, ""):
		return api.Payout{}, false, nil
	case err != nil:
		return api.Payout{}, false, err
	}
	return p, true, nil
}

// createFast is createPayout's batch: the payout is created, or ok is
// false and nothing was written.
func (s *Service) createFast(ctx context.Context, req api.PayoutRequest, data []byte, attrs string) (api.Payout, bool, error) {
	return s.lockedStep(ctx, "create payout", lockAccountSQL, req.AccountID,
		createPayoutFastSQL, req.PayoutID, req.AccountID, req.AmountMinor, req.Currency, data, attrs)
}

// claimFast is claimTx's batch for the first claim of a pending payout
// with the claim's terms: the payout is claimed, or ok is false and
// nothing was written.
func (s *Service) claimFast(ctx context.Context, id string, h fencewire.Holder, terms api.ClaimRequest) (api.Payout, bool, error) {
	if !s.fencing || terms == (api.ClaimRequest{}) || !s.granted(h, terms.AccountID) {
		return api.Payout{}, false, nil
	}
	froms, tos := steps(api.StatePending, api.StateClaimed)
	return s.lockedStep(ctx, "claim", lockPayoutSQL, id,
		claimFastSQL, id, h.Token, h.Owner, froms, tos, terms.AccountID, terms.AmountMinor, terms.Currency)
}

// resultFast is resultTx's batch for a result of a claimed payout whose
// terms this process saw at its claim: the result is recorded, or ok is
// false and nothing was written.
func (s *Service) resultFast(ctx context.Context, id string, h fencewire.Holder, req api.ResultRequest) (api.Payout, bool, error) {
	t, known := s.claimed.get(id)
	if !s.fencing || !known || !s.granted(h, t.AccountID) {
		return api.Payout{}, false, nil
	}
	token := railToken(req, h.Token)
	var q string
	var froms, tos []string
	switch req.Outcome {
	case api.OutcomeAck:
		q = postFastSQL
		froms, tos = steps(api.StateClaimed, api.StateAcknowledged, api.StatePosted)
	case api.OutcomeDecline:
		q = declineFastSQL
		froms, tos = steps(api.StateClaimed, api.StateDeclined)
	default:
		q = ambiguousFastSQL
		froms, tos = steps(api.StateClaimed, api.StateAmbiguous)
	}
	if req.Outcome != api.OutcomeAmbiguous {
		rec := fencewire.RailReceipt{PayoutID: id, AccountID: t.AccountID, AmountMinor: t.AmountMinor, Currency: t.Currency,
			Outcome: string(req.Outcome), RailRef: req.RailRef, RailToken: token}
		if s.checkReceipt(req.Receipt, rec) != nil {
			return api.Payout{}, false, nil
		}
	}
	return s.lockedStep(ctx, "result", lockPayoutSQL, id,
		q, id, h.Token, h.Owner, req.RailRef, token, froms, tos, t.AccountID, t.AmountMinor, t.Currency)
}

// granted reports whether h's proof shows lock-server granted its token
// on account's lock (verifyToken's check, without its log: a refusal is
// the slow path's to log and answer).
func (s *Service) granted(h fencewire.Holder, account string) bool {
	return fencing.Verify(s.proofKeys, h.Proof, payoutevent.Event{AccountID: account}.LockKey(), h.Token) == nil
}

// maxClaimed bounds claimedTerms: past it, an arbitrary entry is dropped
// for each new one (its result then takes the slow path).
const maxClaimed = 1 << 14

// claimedTerms remembers the terms (account, amount, currency) of the
// payouts this process answered a claim for, until their result: what
// resultFast checks the proof and the receipt against before paydb is
// asked. Only a hint: the statement requires the row to hold these terms.
// It is safe for concurrent use.
type claimedTerms struct {
	mu sync.Mutex
	m  map[string]api.ClaimRequest
}

func (c *claimedTerms) put(p api.Payout) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[string]api.ClaimRequest)
	}
	if _, ok := c.m[p.PayoutID]; !ok && len(c.m) >= maxClaimed {
		for id := range c.m {
			delete(c.m, id)
			break
		}
	}
	c.m[p.PayoutID] = api.ClaimRequest{AccountID: p.AccountID, AmountMinor: p.AmountMinor, Currency: p.Currency}
}

func (c *claimedTerms) get(id string) (api.ClaimRequest, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.m[id]
	return t, ok
}

func (c *claimedTerms) forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, id)
}
