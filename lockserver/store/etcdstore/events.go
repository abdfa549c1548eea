package etcdstore

// Log events of the etcd store's restore guard (docs/log-events.md,
// section lock-server).
const (
	// EventRestoreGuardStamped (INFO): the first identity stamp was written
	// for this prefix.
	EventRestoreGuardStamped = "restore_guard_stamped"
	// EventRestoreGuardAdvanced (INFO): `lockctl advance` stamped the
	// cluster past a token.
	EventRestoreGuardAdvanced = "restore_guard_advanced"
)
