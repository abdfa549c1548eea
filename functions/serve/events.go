package serve

// Log events of every function process (docs/log-events.md, section
// "Every function process").
const (
	// EventFunctionStarted (INFO): the function serves, at addr.
	EventFunctionStarted = "function_started"
	// EventFunctionStopping (INFO): SIGTERM or SIGINT arrived; the drain
	// begins.
	EventFunctionStopping = "function_stopping"
	// EventFunctionStopped (INFO): drained, about to exit 0.
	EventFunctionStopped = "function_stopped"
	// EventFunctionFailed (ERROR): the function could not start or its
	// drain had to cut requests.
	EventFunctionFailed = "function_failed"
)
