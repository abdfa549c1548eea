package railstub

// Log events of the rail-stub (docs/log-events.md, section rail-stub).
const (
	// EventSubmissionRecorded (DEBUG): a submission moved money.
	EventSubmissionRecorded = "rail_submission_recorded"
	// EventAnswerWithheld (WARN): fault "hang": recorded, answer withheld.
	EventAnswerWithheld = "rail_answer_withheld"
	// EventReferenceStopped (WARN): a stop order on a reference.
	EventReferenceStopped = "rail_reference_stopped"
	// EventFaultsSet (WARN): faults changed through /admin/faults.
	EventFaultsSet = "rail_faults_set"
	// EventRequestFailed (ERROR): an injected or journal failure.
	EventRequestFailed = "rail_request_failed"
	// EventJournalReloaded (INFO): the journal was read at start.
	EventJournalReloaded = "rail_journal_reloaded"
	// EventJournalTorn (WARN): the journal's last line was incomplete at
	// start and was cut off.
	EventJournalTorn = "rail_journal_torn"
	// EventJournalFailed (ERROR): the journal could not be written; the
	// stub refuses submissions until restarted.
	EventJournalFailed = "rail_journal_failed"
)
