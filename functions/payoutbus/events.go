package payoutbus

// Log events of the push bridge (docs/log-events.md, section "Every
// function process").
const (
	// EventPushDelivered (DEBUG for a 2xx answer, INFO otherwise): a
	// message was posted to the push endpoint (copy, status).
	EventPushDelivered = "push_delivered"
	// EventPushBridgeUnwrappable (ERROR): a message could not be wrapped as
	// a push body; it is acknowledged.
	EventPushBridgeUnwrappable = "push_bridge_unwrappable"
	// EventPushDeadLettered (ERROR): a message's last delivery attempt
	// failed and it was moved to the dead-letter topic.
	EventPushDeadLettered = "push_dead_lettered"
	// EventPushDeadLetterFailed (ERROR): moving it there failed; it is
	// redelivered.
	EventPushDeadLetterFailed = "push_dead_letter_failed"
	// EventPushDeadLetterUnavailable (ERROR, logged by local up): no
	// dead-letter policy could be set; failed messages are redelivered
	// without limit.
	EventPushDeadLetterUnavailable = "push_dead_letter_unavailable"
	// EventPushPullFailed (WARN): a pull failed with an error a retry may
	// change (Pub/Sub restarting or unreachable); the bridge pulls again
	// after retryIn.
	EventPushPullFailed = "push_pull_failed"
	// EventPushAckFailed (WARN): acknowledging an answered message failed;
	// Pub/Sub delivers it again after its deadline (a duplicate).
	EventPushAckFailed = "push_ack_failed"
	// EventPushNackFailed (WARN): handing a failed message back failed
	// (ackId), or handing back what a pull brought as the bridge stopped
	// (messages: how many); their deadline hands them back later.
	EventPushNackFailed = "push_nack_failed"
	// EventPushExtendFailed (WARN): extending the deadlines of the messages
	// in flight failed (messages); one may be delivered a second time
	// while its push is still unanswered.
	EventPushExtendFailed = "push_extend_failed"
)
