package harness

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
)

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// Transcript returns the story of one run, step by step, built from the
// services' log events, with the real tokens.
func Transcript(r *Run) string {
	var b strings.Builder
	s := r.Summary
	fmt.Fprintf(&b, "# %s backend, payment fencing %s, rail fencing %s (logs: %s)\n", s.Backend, onOff(s.PaymentFencing), onOff(s.RailFencing), r.Dir)
	line := func(who, what, verdict string) {
		if verdict == "" {
			fmt.Fprintf(&b, "%s %s\n", who, what)
			return
		}
		fmt.Fprintf(&b, "%s %-46s -> %s\n", who, what, verdict)
	}
	for _, e := range r.Events {
		who := "[" + e.Owner() + "]"
		if e.Name == "self_stop" {
			who = "[A]" // the armed worker; the hook's line carries no owner
		}
		switch {
		case e.Service == "lock-server" && e.Name == "lock_granted":
			line(who, "acquire "+e.Str("key"), fmt.Sprintf("GRANTED  fencingToken=%d (ttl %d ms)", e.Int("token"), e.Int("ttlMs")))
		case e.Service == "payment-resource" && e.Name == api.EventPayoutClaimed:
			line(who, fmt.Sprintf("POST %s  %s: %d", api.ClaimPath(e.Str("payoutId")), api.HeaderToken, e.Int("token")), "200 claimed")
		case e.Service == "executor" && e.Name == "self_stop":
			line(who, fmt.Sprintf("SIGSTOP (pid %d) after its last lease confirmation, before the rail submission", e.Int("pid")), "")
		case e.Service == "harness" && e.Name == "lease_gone":
			fmt.Fprintf(&b, "    lock-server expired A's lease (token %d) on its own schedule, %v after A stopped\n", e.Int("token"), r.LeaseGone.Sub(r.Stopped).Round(10e6))
		case e.Service == "harness" && e.Name == "push_sent" && e.Owner() == "B":
			line(who, "Pub/Sub redelivers the payout event (deliveryAttempt 2)", "")
		case e.Service == "harness" && e.Name == "process_continued":
			line(who, "SIGCONT: still believes it holds the lock, submits the same payout", "")
		case e.Service == "rail-proxy" && e.Name == railapi.EventSubmissionForwarding:
			line(who, fmt.Sprintf("POST %s  %s: %d", railapi.PathSubmissions, railapi.HeaderToken, e.Int("token")), "forwarded to the rail")
		case e.Service == "rail-proxy" && e.Name == railapi.EventFencingBypassed && e.Int("firstToken") > 0:
			fmt.Fprintf(&b, "    rail fencing OFF: payout %s already went to the rail with token %d, forwarded again\n", e.Str("payoutId"), e.Int("firstToken"))
		case e.Service == "rail-proxy" && e.Name == railapi.EventFencingBypassed:
			fmt.Fprintf(&b, "    rail fencing OFF: token %d is below the high-water %d, forwarded anyway\n", e.Int("token"), e.Int("highestToken"))
		case e.Service == "rail-stub" && e.Name == "rail_submission_recorded":
			fmt.Fprintf(&b, "    rail-stub: submission #%d of payout %s, %s (%s): money moved\n", e.Int("seq"), e.Str("payoutId"), e.Str("status"), e.Str("railRef"))
		case e.Service == "executor" && e.Name == "rail_prior_attempt_found":
			line(who, "rail-proxy: the payout already went to the rail", "reports that submission's outcome instead")
		case e.Name == fencewire.EventFencedOut:
			switch e.Str("resource") {
			case "rail":
				line(who, fmt.Sprintf("POST %s  %s: %d", railapi.PathSubmissions, railapi.HeaderToken, e.Int("presentedToken")), "409 "+fencewire.CodeFencedOut)
				fmt.Fprintf(&b, "    rejected: %d is not greater than rail_high_water %d, and the rail is never called\n", e.Int("presentedToken"), e.Int("highestToken"))
			default:
				line(who, fmt.Sprintf("POST %s  %s: %d", api.ResultPath(payoutOf(e)), api.HeaderToken, e.Int("presentedToken")), "409 "+string(api.CodeFencedOut))
				// The payout row's fence is non-strict (one holder makes several
				// steps with one token); the account's is strict (one debit per
				// token).
				if e.Str("resource") == "payout" {
					fmt.Fprintf(&b, "paydb=> UPDATE payout SET state = 'posted', fence = %d WHERE payout_id = '%s' AND fence <= %d ...;  UPDATE 0\n", e.Int("presentedToken"), payoutOf(e), e.Int("presentedToken"))
				} else {
					fmt.Fprintf(&b, "paydb=> UPDATE account SET ... fence = %d WHERE account_id = '%s' AND fence < %d ...;  UPDATE 0\n", e.Int("presentedToken"), e.Str("resourceId"), e.Int("presentedToken"))
				}
				fmt.Fprintf(&b, "    rejected: the %s row already carries fence %d\n", e.Str("resource"), e.Int("highestToken"))
			}
			ev := map[string]any{"event": fencewire.EventFencedOut, "resource": e.Str("resource"), "resourceId": e.Str("resourceId"),
				"presentedToken": e.Int("presentedToken"), "highestToken": e.Int("highestToken"), "ownerId": e.Owner()}
			js, _ := json.Marshal(ev)
			fmt.Fprintf(&b, "%s\n", js)
		case e.Service == "payment-resource" && e.Name == api.EventPayoutPosted:
			line(who, fmt.Sprintf("POST %s  %s: %d", api.ResultPath(e.Str("payoutId")), api.HeaderToken, e.Int("token")), "200 posted")
			fmt.Fprintf(&b, "paydb=> UPDATE account SET balance_minor = balance_minor - %d, fence = %d\n", e.Int("amountMinor"), e.Int("token"))
			if s.PaymentFencing {
				fmt.Fprintf(&b, "paydb->  WHERE account_id = '%s' AND currency = '%s' AND fence < %d ...;  UPDATE 1  (debit #%d)\n", e.Str("accountId"), e.Str("currency"), e.Int("token"), e.Int("debits"))
			} else {
				fmt.Fprintf(&b, "paydb->  WHERE account_id = '%s' AND currency = '%s' ...;  UPDATE 1  (debit #%d; no fence predicate: payment fencing off)\n", e.Str("accountId"), e.Str("currency"), e.Int("debits"))
			}
		case e.Service == "payment-resource" && e.Name == api.EventResultReplayed:
			line(who, fmt.Sprintf("POST %s  %s: %d", api.ResultPath(e.Str("payoutId")), api.HeaderToken, e.Int("token")), "200 already posted (replay, no new debit)")
		case e.Service == "harness" && e.Name == "push_answered":
			fmt.Fprintf(&b, "%s push answered %s\n", who, e.Str("answer"))
		}
	}
	fmt.Fprintf(&b, "measured at the rail-stub, raildb and the ledger: railSubmissions=%d debits=%d ledgerBalanced=%v (tokens A=%d B=%d)\n",
		s.RailSubmissions, s.Debits, s.LedgerBalanced, s.TokenA, s.TokenB)
	return b.String()
}

// payoutOf returns the payout id of a fence refusal on the payout, or
// its resource id otherwise.
func payoutOf(e Event) string {
	if p := e.Str("payoutId"); p != "" {
		return p
	}
	return e.Str("resourceId")
}

// Table returns the matrix of runs as a text table.
func Table(runs []*Run) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-9s %-8s %-5s %-7s %-7s %-7s %-7s %-9s %s\n", "backend", "payment", "rail", "tokenA", "tokenB", "atRail", "debits", "balanced", "fenced_out (resource presented<highest)")
	for _, r := range runs {
		s := r.Summary
		var f []string
		for _, x := range s.FencedOut {
			f = append(f, fmt.Sprintf("%s %d<%d", x.Resource, x.PresentedToken, x.HighestToken))
		}
		if len(f) == 0 {
			f = []string{"-"}
		}
		fmt.Fprintf(&b, "%-9s %-8s %-5s %-7d %-7d %-7d %-7d %-9v %s\n", s.Backend, onOff(s.PaymentFencing), onOff(s.RailFencing), s.TokenA, s.TokenB, s.RailSubmissions, s.Debits, s.LedgerBalanced, strings.Join(f, ", "))
	}
	return b.String()
}

// Timeline returns an SVG picture of one run (see timeline.go).
func Timeline(r *Run) []byte { return timelineSVG(r) }
