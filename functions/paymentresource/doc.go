// Package paymentresource is payment-resource, the resource the payout lock
// is supposed to protect, and fence point one of the payout pipeline.
//
// It keeps accounts, payouts (with a state machine and its history), a
// double-entry ledger and a transactional outbox in one PostgreSQL database
// (paydb), and serves them over HTTP/JSON. The wire contract (routes,
// bodies, error codes, headers, bounds, configuration variables and log
// event names) is package functions/paymentresource/api; callers use the
// typed client in functions/paymentresource/client.
//
// # Safety model
//
// The executor holds the lease "payout:{account_id}" while it claims a
// payout, submits it to the rail and posts the result. The lease alone
// protects nothing: a holder that pauses (GC, SIGSTOP, a slow network) can
// resume after its lease expired and a newer holder took over, and then
// write as if it still held the lock. What protects the ledger is that
// every write here carries the holder's fencing token (header
// X-Fencing-Token) and is a conditional UPDATE on the row it changes:
//
//   - the payout row is fenced non-strictly (fence <= token): one holder may
//     claim and then post with the same token;
//   - the account row is fenced strictly (fence < token) by the debit
//     itself: one debit per token, and never one by a token older than the
//     last debit.
//
// A write whose conditional UPDATE matches no row is refused (409
// FENCED_OUT), rolled back whole, and logged as the fenced_out event. The
// fence values are persisted in the rows, so they survive a restart.
//
// The fence does not make a stale holder's rail submission undone: a rail
// payment is a fact no transaction can roll back. Stopping the submission
// itself is fence point two (rail-proxy). Here the fence keeps the ledger
// from recording the writes of a holder that has been superseded.
//
// # Kill switch
//
// PAYMENT_FENCING_ENABLED=false (Config.FencingDisabled) runs the same
// statements without their fence predicates (a fence column still only
// grows), and lets an ACK with a new rail reference post a second debit on
// an already posted payout. It exists only so that the fencing experiment
// can show the corruption (Audit then reports balanced=false); it is logged
// at WARN when New starts.
//
// # Outbox
//
// Creating a payout writes the payout row and an outbox row holding its
// payoutevent.Event in one transaction. A background publisher drains the
// outbox in id order through a Publisher and marks each row published once
// the broker acknowledged it. A created payout's event is therefore
// published at least once, even if the process dies right after answering;
// duplicates are expected downstream.
package paymentresource
