// Package ledgeraudit checks paydb's ledger (INV-05) in one read-only
// transaction: Run reports every broken rule. It opens no service and
// writes nothing, so an auditor (the reconciler, the harness) links it
// without payment-resource.
package ledgeraudit

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgerr"
)

// ErrUnavailable: paydb did not answer.
var ErrUnavailable = errors.New("ledgeraudit: paydb unavailable")

func dbError(op string, err error) error {
	if pgerr.Unavailable(err) {
		return fmt.Errorf("%w: %s: %v", ErrUnavailable, op, err)
	}
	return fmt.Errorf("ledgeraudit: %s: %w", op, err)
}

// Run checks the ledger of the paydb behind pool (INV-05) in one
// read-only REPEATABLE READ transaction, so that every rule sees the same
// snapshot:
//
//   - every ledger transaction sums to zero (api.CheckTxnBalanced);
//   - every account's balance equals its opening balance minus the sum of
//     its posted debits (api.CheckAccountBalance);
//   - every posted payout has exactly one debit equal to its amount, and no
//     other payout has any (api.CheckOneDebitPerPayout).
//
// Broken rules are reported in the api.AuditReport, not as an error; the
// error is the database's (wrapping ErrUnavailable when it did not answer).
func Run(ctx context.Context, pool *pgxpool.Pool) (api.AuditReport, error) {
	rep := api.AuditReport{Violations: []api.Violation{}}
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return rep, dbError("audit: begin", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM account), (SELECT count(*) FROM payout),
       (SELECT count(*) FROM ledger_txn WHERE kind = 'payout_debit')`).Scan(&rep.Accounts, &rep.Payouts, &rep.Debits); err != nil {
		return rep, dbError("audit: counts", err)
	}

	type check struct {
		name  string
		query string
		scan  func(pgx.CollectableRow) (api.Violation, error)
	}
	checks := []check{
		{api.CheckTxnBalanced, `SELECT txn_id, currency, sum(amount_minor) FROM ledger_entry
GROUP BY txn_id, currency HAVING sum(amount_minor) <> 0 ORDER BY txn_id, currency`,
			func(r pgx.CollectableRow) (api.Violation, error) {
				var txn, sum int64
				var ccy string
				err := r.Scan(&txn, &ccy, &sum)
				return api.Violation{Check: api.CheckTxnBalanced, Subject: fmt.Sprint(txn), Detail: fmt.Sprintf("entries in %s sum to %d, not 0", ccy, sum)}, err
			}},
		{api.CheckAccountBalance, `SELECT a.account_id, a.opening_balance_minor, a.balance_minor, coalesce(sum(e.amount_minor), 0)
FROM account a LEFT JOIN ledger_entry e ON e.ledger_account = 'account:' || a.account_id
GROUP BY a.account_id HAVING a.balance_minor <> a.opening_balance_minor + coalesce(sum(e.amount_minor), 0)
ORDER BY a.account_id`,
			func(r pgx.CollectableRow) (api.Violation, error) {
				var id string
				var opening, balance, posted int64
				err := r.Scan(&id, &opening, &balance, &posted)
				return api.Violation{Check: api.CheckAccountBalance, Subject: id, Detail: fmt.Sprintf("balance %d, but opening %d minus posted debits %d is %d",
					balance, opening, -posted, opening+posted)}, err
			}},
		{api.CheckOneDebitPerPayout, `WITH debit AS (
    SELECT t.txn_id, t.payout_id,
           -coalesce(sum(e.amount_minor) FILTER (WHERE e.ledger_account = 'account:' || p.account_id AND e.currency = p.currency), 0) AS amount
    FROM ledger_txn t JOIN payout p USING (payout_id) LEFT JOIN ledger_entry e USING (txn_id)
    WHERE t.kind = 'payout_debit'
    GROUP BY t.txn_id, t.payout_id
)
SELECT p.payout_id, p.state, p.amount_minor, count(d.txn_id),
       coalesce(array_agg(d.amount ORDER BY d.txn_id) FILTER (WHERE d.txn_id IS NOT NULL), '{}')
FROM payout p LEFT JOIN debit d USING (payout_id)
GROUP BY p.payout_id, p.state, p.amount_minor
HAVING (p.state = 'posted' AND (count(d.txn_id) <> 1 OR bool_or(d.amount <> p.amount_minor)))
    OR (p.state <> 'posted' AND count(d.txn_id) > 0)
ORDER BY p.payout_id`,
			func(r pgx.CollectableRow) (api.Violation, error) {
				var id, state string
				var amount, n int64
				var debits []int64
				err := r.Scan(&id, &state, &amount, &n, &debits)
				return api.Violation{Check: api.CheckOneDebitPerPayout, Subject: id, Detail: fmt.Sprintf("%s payout of %d has %d debit(s) %v", state, amount, n, debits)}, err
			}},
	}
	for _, c := range checks {
		rows, err := tx.Query(ctx, c.query)
		if err != nil {
			return rep, dbError("audit: "+c.name, err)
		}
		found, err := pgx.CollectRows(rows, c.scan)
		if err != nil {
			return rep, dbError("audit: "+c.name, err)
		}
		rep.Violations = append(rep.Violations, found...)
	}
	rep.Balanced = len(rep.Violations) == 0
	return rep, nil
}
