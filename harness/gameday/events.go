package gameday

// Log events of the game day driver (docs/log-events.md).
const (
	// EventFaultInjected: a fault was put in place; its alerts are awaited.
	EventFaultInjected = "gameday_fault_injected"
	// EventAlertReceived: an awaited alert reached the driver's webhook.
	EventAlertReceived = "gameday_alert_received"
	// EventAlertMissing: an awaited alert did not arrive in time.
	EventAlertMissing = "gameday_alert_missing"
)
