package explore

// Report: what a schedule reached (its paths, coverage evidence) and how
// its result is written.

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
)

// Paths: the rail-proxy outcomes a schedule may reach, as Result.Paths
// names them. Each is judged from rail-proxy's answers (seen in front of
// it) or from raildb after the schedule.
const (
	// PathForwarded: a submission went to the rail and was answered 200.
	PathForwarded = "forwarded"
	// PathFencedOut: a submission was refused 409 FENCED_OUT.
	PathFencedOut = "fenced-out"
	// PathAlreadySubmitted: a submission was refused 409
	// PAYOUT_ALREADY_SUBMITTED with the payout's forward.
	PathAlreadySubmitted = "already-submitted"
	// PathAmbiguous: a submission was answered 502 RAIL_AMBIGUOUS.
	PathAmbiguous = "rail-ambiguous"
	// PathNotSentReleased: the rail refused a call and recorded nothing;
	// rail-proxy recorded the attempt not_sent and released the payout's
	// forward (an attempt of raildb in state not_sent).
	PathNotSentReleased = "not-sent-released"
	// PathNotSentKept: the rail refused a call and recorded nothing, but
	// the attempt had meanwhile been marked ambiguous (abandoned) or
	// reconciled: it stayed the payout's forward (a RAIL_NOT_REACHED
	// answer without its not_sent attempt).
	PathNotSentKept = "not-sent-kept"
	// PathResendAfterNotSent: after a not_sent release, a later attempt of
	// the same payout with the same token (the holder's own resend) was
	// let through to the rail.
	PathResendAfterNotSent = "own-resend-after-not-sent"
	// PathStaleResendFenced: a resend (FaultResend) was refused
	// FENCED_OUT: a newer holder had raised the high-water mark.
	PathStaleResendFenced = "stale-resend-fenced"
	// PathInvalidTerms: a submission was refused 403 INVALID_TERMS.
	PathInvalidTerms = "invalid-terms"
	// PathClosed: a reconciliation closed a payout rail-proxy had never
	// forwarded (no forward before it, answered 200).
	PathClosed = "closed-never-forwarded"
	// PathLateAfterClose: a submission of a payout arrived after a
	// reconciliation had closed it (and was refused).
	PathLateAfterClose = "late-submission-after-close"
	// PathStopped: a submission reached the rail after a reconciliation's
	// stop order and was answered 409 PAYOUT_STOPPED.
	PathStopped = "payout-stopped"
	// PathReconciled: a reconciliation resolved a forwarded attempt that
	// was forwarding or ambiguous (answered 200, resolved).
	PathReconciled = "reconciled-in-doubt"
)

// String is r on one line, tab-separated: the schedule, the checks broken,
// the payouts' end states, the paths reached and the grants of a restarted
// replica. Two runs of the same seed and budget write the same lines, so a
// report of them can be compared with diff.
func (r Result) String() string {
	return fmt.Sprintf("%s\tchecks=%s\tended=%s\tpaths=%s\trestarted-grants=%d",
		r.Schedule, strings.Join(r.Checks, ","), strings.Join(r.Ended, ","), strings.Join(r.Paths, ","), r.RestartedGrants)
}

// paths names the rail-proxy outcomes a schedule reached, from
// rail-proxy's answers and raildb's attempts at the end.
func paths(answers []answer, attempts []attempt) []string {
	paths := map[string]bool{}
	closed := map[string]bool{}
	notReached := 0
	for _, an := range answers {
		if an.reconciliation {
			switch {
			case an.closed:
				paths[PathClosed], closed[an.payout] = true, true
			case an.resolved:
				paths[PathReconciled] = true
			}
			continue
		}
		if closed[an.payout] && !an.forged {
			// The close made the closing attempt the payout's forward:
			// rail-proxy itself refuses what comes later, before the rail
			// (the stop order there is the second line, not the first).
			paths[PathLateAfterClose] = true
		}
		switch {
		case an.status == http.StatusOK:
			paths[PathForwarded] = true
		case an.code == railapi.CodeFencedOut:
			paths[PathFencedOut] = true
			if an.resend {
				paths[PathStaleResendFenced] = true
			}
		case an.code == railapi.CodeAlreadySubmitted:
			paths[PathAlreadySubmitted] = true
		case an.code == railapi.CodeRailAmbiguous:
			paths[PathAmbiguous] = true
		case an.code == railapi.CodeRailNotReached:
			notReached++
		case an.code == railapi.CodeInvalidTerms:
			paths[PathInvalidTerms] = true
		case an.code == railapi.CodePayoutStopped:
			paths[PathStopped] = true
		}
	}
	notSent := map[string][]int64{} // payout -> tokens of its not_sent attempts
	released := 0
	for _, a := range attempts {
		switch a.state {
		case railapi.StateNotSent:
			released++
			notSent[a.payout] = append(notSent[a.payout], a.token)
		case railapi.StateFenced, railapi.StateDuplicate:
		default:
			if slices.Contains(notSent[a.payout], a.token) {
				paths[PathResendAfterNotSent] = true
			}
		}
	}
	if released > 0 {
		paths[PathNotSentReleased] = true
	}
	if notReached > released {
		paths[PathNotSentKept] = true
	}
	return slices.Sorted(maps.Keys(paths))
}
