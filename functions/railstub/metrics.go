package railstub

import (
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/prometheus/client_golang/prometheus"
)

// The rail's own counts, from its record of submissions: what the
// payout-safety SLO (ops/slo.yaml) is judged from. Neither has a label.
var (
	submissions = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "rail_submissions_total",
		Help: "Submissions the rail recorded in its journal (every accepted POST " + rail.PathSubmit + "; an injected error fault, or a refusal of a stopped reference, records nothing; stop orders are not submissions).",
	})
	duplicates = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "rail_duplicate_submissions_total",
		Help: "Submissions the rail recorded for a payout id it already had in its journal (reloaded records included): money may have moved twice (INV-04).",
	})
)

// Collectors returns the rail's metrics, for the registry its process
// serves: rail_submissions_total and rail_duplicate_submissions_total,
// both counted by the process since it started (a restart starts them at
// 0, as Prometheus expects of counters) while the duplicate check reads
// the whole journal.
func Collectors() []prometheus.Collector { return []prometheus.Collector{submissions, duplicates} }

// count counts one submission recorded for payoutID. s.mu is held.
func (s *Stub) count(payoutID string) {
	submissions.Inc()
	if s.perID[payoutID] > 0 {
		duplicates.Inc()
	}
	s.perID[payoutID]++
}
