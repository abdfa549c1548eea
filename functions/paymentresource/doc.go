// Package paymentresource is payment-resource, fence point one of the
// payout pipeline: accounts, payouts with their state machine, a
// double-entry ledger and an outbox of payout events, in one PostgreSQL
// database (paydb).
//
// New(ctx, cfg, pub, logger) returns a Service whose Handler serves the
// routes of functions/paymentresource/api; Close it when done. Every write
// carries the holder's fencing token and is a conditional UPDATE of the row
// it changes (the payout fenced non-strictly, the account's debit
// strictly); one that matches no row is rolled back and answered 409 with
// the reason: FENCED_OUT when a newer token has written, otherwise the
// payout's state (PAYOUT_FINISHED, PAYOUT_IN_DOUBT, PAYOUT_NEEDS_ATTENTION,
// PAYOUT_NOT_CLAIMED). Creating a payout writes its event to the outbox in
// the same transaction, published at least once through pub.
// ledgeraudit.Run checks the books.
// Design and kill switch: docs/payout-pipeline.md.
package paymentresource
