// Package paymentresource is payment-resource, fence point one of the
// payout pipeline: accounts, payouts with their state machine, a
// double-entry ledger and an outbox of payout events, in one PostgreSQL
// database (paydb).
//
// New(ctx, cfg, pub, logger) returns a Service whose Handler serves the
// routes of functions/paymentresource/api; Close it when done. Every write
// carries the holder's fencing token and is a conditional UPDATE of the row
// it changes (the payout fenced non-strictly, the account's debit
// strictly); one that matches no row is refused with 409 FENCED_OUT and
// rolled back. Creating a payout writes its event to the outbox in the same
// transaction, published at least once through pub. Audit checks the books.
// Design and kill switch: docs/payout-pipeline.md.
package paymentresource
