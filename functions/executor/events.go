package executor

// Log events of the executor: the value of the "event" attribute of its
// log lines (docs/log-events.md, section executor). Some share a name with
// payment-resource's events of the same kind (payout_posted, for
// instance); the executor logs its own view of the same thing.
const (
	// EventPushBodyRefused: WARN, the request body is not one well-formed
	// push envelope; answered 400 INVALID_REQUEST.
	EventPushBodyRefused = "push_body_refused"
	// EventPayoutEventReceived: DEBUG, a push arrived.
	EventPayoutEventReceived = "payout_event_received"
	// EventPayoutEventMalformed: the message does not decode; acknowledged.
	EventPayoutEventMalformed = "payout_event_malformed"
	// EventPayoutEventUnknownPayout: the payout does not exist, or
	// lock-server refuses its lock key; acknowledged.
	EventPayoutEventUnknownPayout = "payout_event_unknown_payout"
	// EventPayoutEventMismatch: the message does not describe its payout;
	// acknowledged.
	EventPayoutEventMismatch = "payout_event_mismatch"
	// EventLeaseAcquired: DEBUG, the lease this execution runs under.
	EventLeaseAcquired = "lease_acquired"
	// EventPayoutClaimed: DEBUG, claimed at payment-resource with the token.
	EventPayoutClaimed = "payout_claimed"
	// EventPayoutAlreadyDone: the payout was finished before; nothing to do.
	EventPayoutAlreadyDone = "payout_already_done"
	// EventPayoutInDoubt: the payout's rail outcome is unknown; nothing to do.
	EventPayoutInDoubt = "payout_in_doubt"
	// EventPayoutAlreadyNeedsAttention: the payout already waits for a
	// person; nothing to do.
	EventPayoutAlreadyNeedsAttention = "payout_already_needs_attention"
	// EventRailPriorAttemptFound: rail-proxy refused the submission as the
	// payout's second; the first attempt's outcome is reported instead.
	EventRailPriorAttemptFound = "rail_prior_attempt_found"
	// EventRailPriorAttemptMismatch: ERROR, the submission that went to the
	// rail under this payout's id describes another payout.
	EventRailPriorAttemptMismatch = "rail_prior_attempt_mismatch"
	// EventLeaseLost: the lease was lost before a step; nothing was sent.
	EventLeaseLost = "lease_lost"
	// EventRailSubmissionAccepted: DEBUG, the rail answered ACK or DECLINE.
	EventRailSubmissionAccepted = "rail_submission_accepted"
	// EventRailSubmissionAmbiguous: the rail's outcome is unknown.
	EventRailSubmissionAmbiguous = "rail_submission_ambiguous"
	// EventPayoutStoppedAtRail: WARN, rail-proxy answered PAYOUT_STOPPED (a
	// reconciliation stopped the payout's reference at the rail); the
	// payout is marked ambiguous for the reconciler to fail. (rail-proxy's
	// own line for the same refusal is rail_submission_stopped.)
	EventPayoutStoppedAtRail = "payout_stopped_at_rail"
	// EventPayoutFencedStale: WARN, a fence point refused this worker's
	// token, or a dependency refused it for good after its lease ended,
	// and a newer holder exists; answered 409 for redelivery.
	EventPayoutFencedStale = "payout_fenced_stale"
	// EventPayoutFenceAheadOfLease: ERROR, a fence point refused the token
	// of the current lease; the payout is marked needs_attention.
	EventPayoutFenceAheadOfLease = "payout_fence_ahead_of_lease"
	// EventPayoutRefusedPermanently: ERROR, an answer no retry can change.
	EventPayoutRefusedPermanently = "payout_refused_permanently"
	// EventPayoutNeedsAttention: ERROR, the payout was marked needs_attention.
	EventPayoutNeedsAttention = "payout_needs_attention"
	// EventPayoutAttentionUnrecorded: ERROR, the payout needs attention but
	// the mark could not be written.
	EventPayoutAttentionUnrecorded = "payout_attention_unrecorded"
	// EventPayoutResultRefused: WARN, payment-resource did not take the
	// result after the in-process retries.
	EventPayoutResultRefused = "payout_result_refused"
	// EventPayoutPosted, EventPayoutDeclined and EventPayoutAmbiguous: the
	// outcome recorded at payment-resource (INFO; ambiguous WARN): the
	// executor's one INFO line of a payout that went through.
	EventPayoutPosted    = "payout_posted"
	EventPayoutDeclined  = "payout_declined"
	EventPayoutAmbiguous = "payout_ambiguous"
	// EventLeaseReleased (DEBUG) and EventLeaseReleaseFailed: the
	// release's answer, logged after the push's answer (the release is
	// sent once the push is answered).
	EventLeaseReleased      = "lease_released"
	EventLeaseReleaseFailed = "lease_release_failed"
	// EventReleasesUnfinished: WARN at stop, lease releases were still in
	// flight when the wait for them (Close) ended; those leases end by
	// their TTL.
	EventReleasesUnfinished = "lease_releases_unfinished"
	// EventExecutionDone: DEBUG, the push is acknowledged (the outcome's
	// own line said so).
	EventExecutionDone = "payout_execution_done"
	// EventExecutionRetry: the push is left for redelivery (status).
	EventExecutionRetry = "payout_execution_retry"
)
