package tfdriver

// Log events of the Terraform driver (docs/log-events.md, section
// terraform).
const (
	// EventStepStarted, EventStepDone and EventStepFailed bracket each
	// terraform step (init, plan, apply, output, destroy): step,
	// duration_ms, err.
	EventStepStarted = "tf_step_started"
	EventStepDone    = "tf_step_done"
	EventStepFailed  = "tf_step_failed"
	// EventPlanCounts (INFO): what a plan would create, update and delete.
	EventPlanCounts = "tf_plan_counts"
)
