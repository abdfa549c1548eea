package lockserver

// Log events of lock-server: the value of the "event" attribute of its log
// lines (docs/log-events.md, section lock-server). The wait queue's are in
// waitqueue.go; the stores' own events are constants of
// lockserver/store/pgstore and lockserver/store/etcdstore.
const (
	// EventServerStarted, EventServerStopping and EventServerStopped
	// (INFO) are the process's lifecycle.
	EventServerStarted  = "server_started"
	EventServerStopping = "server_stopping"
	EventServerStopped  = "server_stopped"
	// EventServerDrainTimeout (WARN): the drain on SIGTERM ran out of
	// time; the remaining connections were closed.
	EventServerDrainTimeout = "server_drain_timeout"
	// EventLockGranted (INFO): a lease was granted. Its "grantedBy"
	// field is one of the GrantedBy values: which of the store's three
	// granting statements minted the token.
	EventLockGranted = "lock_granted"
	// EventLeaseRenewed (DEBUG): a lease was extended.
	EventLeaseRenewed = "lease_renewed"
	// EventLeaseReleased (DEBUG): a holder released its lease.
	EventLeaseReleased = "lease_released"
	// EventLeaseRevoked (WARN): an operator force-revoked a lease.
	EventLeaseRevoked = "lease_revoked"
	// EventBackendUnready (WARN): /readyz found the backend unreachable.
	EventBackendUnready = "backend_unready"
	// EventBackendRestored (ERROR): an acquire was refused with 503
	// BACKEND_RESTORED.
	EventBackendRestored = "backend_restored"
	// EventGrantWithdrawFailed (WARN): revoking a withdrawn grant failed.
	EventGrantWithdrawFailed = "grant_withdraw_failed"
	// EventGrantAbandoned (INFO): an acquire was granted but its request
	// had ended before lock-server wrote the grant (or, batched, while
	// its batch was in flight), so nobody can hold it: the grant was
	// released in the background, conditional on its token, and the
	// key's waiters on this lock-server woken. The wait queue's own case
	// is EventWaitGrantAbandoned.
	EventGrantAbandoned = "grant_abandoned"
	// EventAbandonedReleaseFailed (WARN): releasing such an abandoned
	// grant failed, or was not started because lock-server was closing;
	// its lease expires after its TTL, held by nobody meanwhile.
	EventAbandonedReleaseFailed = "abandoned_release_failed"
	// EventAbandonedReleasesUnfinished (WARN): at shutdown, releases of
	// abandoned grants were still running when lock-server stopped
	// waiting for them; their leases end by their TTL if they fail.
	EventAbandonedReleasesUnfinished = "abandoned_releases_unfinished"
	// EventAcquireRefused, EventRenewRefused, EventReleaseRefused,
	// EventRevokeRefused and EventInspectRefused: a request was refused
	// (a 4xx; DEBUG for LOCK_HELD, INFO otherwise).
	EventAcquireRefused = "acquire_refused"
	EventRenewRefused   = "renew_refused"
	EventReleaseRefused = "release_refused"
	EventRevokeRefused  = "revoke_refused"
	EventInspectRefused = "inspect_refused"
	// EventAcquireFailed, EventRenewFailed, EventReleaseFailed,
	// EventRevokeFailed and EventInspectFailed (ERROR): the backend did not
	// answer (503) or a bug (500).
	EventAcquireFailed = "acquire_failed"
	EventRenewFailed   = "renew_failed"
	EventReleaseFailed = "release_failed"
	EventRevokeFailed  = "revoke_failed"
	EventInspectFailed = "inspect_failed"
)

// Values of the "grantedBy" field of EventLockGranted: the path, and so
// the store statement, that minted the token (docs/token-trace.md).
const (
	// GrantedByAcquire: the acquire went to the store alone (Acquire).
	GrantedByAcquire = "acquire"
	// GrantedByGroup: the acquire went to the store in one round trip
	// with other keys' acquires (a Batcher's group grant, AcquireMany).
	GrantedByGroup = "group"
	// GrantedByHandoff: a release handed the key to this waiting acquire
	// in the release's own transaction (Handoff).
	GrantedByHandoff = "handoff"
)
