package gameday

import (
	"context"
	"time"

	payapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/harness/drive"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/link"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

// The network faults: each on one link of the stack (stack.Config.Links,
// package local/link), in a phase of their own (Fault.Links), after the
// process faults. Prometheus scrapes every service directly, so a fault
// on a link never hides a metric, only the traffic between two parts.
func init() { Faults = append(Faults, netFaults...) }

var netFaults = []Fault{
	{
		// lock-server's connections to lockdb pass nothing (a partition
		// that drops packets): lockdb is up and answers the operator,
		// lock-server's grants wait out their statement timeouts.
		Name:   "lockdb-partitioned",
		Links:  true,
		Alerts: []string{"LockStoreUnreachable"},
		Inject: func(ctx context.Context, e *env) error {
			return onLink(e.st, stack.LinkLockDB, link.Fault{Kind: link.Timeout})
		},
		Heal: func(ctx context.Context, e *env) error { return healLink(e.st, stack.LinkLockDB) },
		// lockctl ready: lock-server says its store does not answer.
		Confirms: map[string]string{"LockStoreUnreachable": `(?i)unavailable|unreachable|not ready`},
	},
	{
		// The rail pays and its answers are lost on the way back to
		// rail-proxy (the connection closes before a byte of them): the
		// payouts are ambiguous, as with payout-ambiguous, but the rail's
		// record says nothing was withheld: the rail answered, the
		// network lost it. Three of them are the rate RailCallsAmbiguous
		// pages on; more would only age. The heal runs a reconciler
		// pass, which finds the payments and posts the payouts.
		Name:         "rail-answer-lost",
		Links:        true,
		Executes:     true,
		Alerts:       []string{"RailCallsAmbiguous", "PayoutAmbiguousTooLong"},
		AlertTimeout: 150 * time.Second,
		Inject: func(ctx context.Context, e *env) error {
			if err := onLink(e.st, stack.LinkRail, link.Fault{Kind: link.ResetAfter}); err != nil {
				return err
			}
			actx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			id, err := awaitPayoutIn(actx, e.st.PayDBURL(), payapi.StateAmbiguous, 3)
			if err != nil {
				return err
			}
			e.set("ID", id)
			return healLink(e.st, stack.LinkRail)
		},
		Heal: func(ctx context.Context, e *env) error {
			_, err := drive.Reconcile(ctx, e.st.ReconcilerURL())
			return err
		},
		// The rail's record of it: paid.
		Confirms: map[string]string{"PayoutAmbiguousTooLong": `"status":"ACK"`,
			// rail-proxy's count of ambiguous forwards.
			"RailCallsAmbiguous": `railproxy_forwards_total\{state="ambiguous"\} [1-9]`},
	},
	{
		// The executor cut off from lock-server (connections refused):
		// every delivery fails to take the account's lock and is
		// redelivered; payouts are created and none completes. (No
		// message runs out of delivery attempts within the alert
		// timeout: PayoutDeadLettered stays quiet.)
		Name:     "executor-cut-from-lock-server",
		Links:    true,
		Executes: true,
		Alerts:   []string{"PayoutsNotCompleting"},
		Inject: func(ctx context.Context, e *env) error {
			return onLink(e.st, stack.ExecutorLink("A", stack.ToLockServer), link.Fault{Kind: link.Cut})
		},
		Heal: func(ctx context.Context, e *env) error {
			return healLink(e.st, stack.ExecutorLink("A", stack.ToLockServer))
		},
		// The runbook's count of unfinished payouts: pending, none
		// claimed (the lock is never taken).
		Confirms: map[string]string{"PayoutsNotCompleting": `pending\s*\|\s*[1-9]`},
	},
	{
		// The executor's answers to the push are lost (it executes each
		// delivery, the subscription never hears back): every payout is
		// redelivered, each redelivery finds it done, and the messages
		// are dead-lettered although their payouts were paid once.
		Name:     "push-answers-lost",
		Links:    true,
		Executes: true,
		Alerts:   []string{"PayoutDeadLettered"},
		Inject: func(ctx context.Context, e *env) error {
			return onLink(e.st, stack.PushLink("A"), link.Fault{Kind: link.ResetAfter})
		},
		Heal: func(ctx context.Context, e *env) error { return healLink(e.st, stack.PushLink("A")) },
		// The bridge's failed pushes: no answer.
		Confirms: map[string]string{"PayoutDeadLettered": `"status":0`},
	},
}

// onLink puts f on the stack's link called name.
func onLink(st *stack.Stack, name string, f link.Fault) error {
	l, err := st.Link(name)
	if err != nil {
		return err
	}
	return l.Inject(f)
}

// healLink heals the stack's link called name.
func healLink(st *stack.Stack, name string) error {
	l, err := st.Link(name)
	if err != nil {
		return err
	}
	return l.Heal()
}
