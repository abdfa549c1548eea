package paymentresource

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
)

// CompletionBuckets are the bucket bounds of payout_completion_seconds,
// in seconds. 60 is the payout-completion SLO's threshold (ops/slo.yaml).
var CompletionBuckets = []float64{0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600}

// completion observes, once per payout, the seconds from its creation to
// the moment it reached posted or declined.
var completion = prometheus.NewHistogram(prometheus.HistogramOpts{
	Name:    "payout_completion_seconds",
	Help:    "Seconds from a payout's creation to its final state, posted or declined (observed once per payout, by the transaction that finishes it).",
	Buckets: CompletionBuckets,
})

// creations counts payouts created, once each: a request that finds its
// payout already there (a replay) and a list of payouts are not counted.
// PayoutsNotCompleting (ops/slo.yaml) compares it with completion.
var creations = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "payouts_created_total",
	Help: "Payouts created (counted once each, after the transaction that inserts it commits; a replay of an existing payout is not counted).",
})

// Metric names of the ages read at each scrape.
const (
	metricAmbiguousAge = "payouts_ambiguous_oldest_age_seconds"
	metricOutboxAge    = "payment_outbox_oldest_unpublished_age_seconds"
)

// ageTimeout bounds the queries of one scrape.
const ageTimeout = 2 * time.Second

// ageQuery reads both ages, in seconds, 0 when nothing is waiting, by
// paydb's clock. Each subquery reads a partial index
// (payout_ambiguous_idx, outbox_unpublished_idx). An ambiguous payout's
// age counts from its last update, the moment it was marked ambiguous.
const ageQuery = `SELECT
  coalesce((SELECT EXTRACT(EPOCH FROM now() - min(updated_at)) FROM payout WHERE state = 'ambiguous'), 0)::float8,
  coalesce((SELECT EXTRACT(EPOCH FROM now() - created_at) FROM outbox WHERE published_at IS NULL ORDER BY id LIMIT 1), 0)::float8`

// ageCollector reports, at each scrape, the age of the oldest ambiguous
// payout and of the oldest unpublished outbox row of every live Service of
// the process (New adds it, Close removes it; a process has one): the
// largest of each, 0 when there is none. Reading them at the scrape, not
// in the outbox's loop, keeps them true when that loop is the thing that
// is stuck. A Service whose paydb does not answer within ageTimeout is
// left out and logged (paydb_age_query_failed); with no answer at all the
// gauges are absent, which the symptom alerts read as no data.
type ageCollector struct {
	mu   sync.Mutex
	live []*Service
}

var ages = &ageCollector{}

var (
	ambiguousAgeDesc = prometheus.NewDesc(metricAmbiguousAge,
		"Age in seconds of the oldest payout in state "+string(api.StateAmbiguous)+" (since it was marked so), 0 when there is none; read from paydb at each scrape.", nil, nil)
	outboxAgeDesc = prometheus.NewDesc(metricOutboxAge,
		"Age in seconds of the oldest outbox row not yet published to Pub/Sub, 0 when the outbox is empty; read from paydb at each scrape.", nil, nil)
)

func (a *ageCollector) add(s *Service) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.live = append(a.live, s)
}

func (a *ageCollector) remove(s *Service) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.live = slices.DeleteFunc(a.live, func(x *Service) bool { return x == s })
}

// Describe implements prometheus.Collector.
func (a *ageCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- ambiguousAgeDesc
	ch <- outboxAgeDesc
}

// Collect implements prometheus.Collector: one query per live Service.
func (a *ageCollector) Collect(ch chan<- prometheus.Metric) {
	a.mu.Lock()
	live := slices.Clone(a.live)
	a.mu.Unlock()
	var ambiguous, outbox float64
	answered := false
	for _, s := range live {
		amb, out, err := s.oldestAges(context.Background())
		if err != nil {
			s.log.Warn("paydb did not answer the metrics' age query", "event", api.EventAgeQueryFailed, "error", err.Error())
			continue
		}
		answered = true
		ambiguous, outbox = max(ambiguous, amb), max(outbox, out)
	}
	if !answered {
		return
	}
	ch <- prometheus.MustNewConstMetric(ambiguousAgeDesc, prometheus.GaugeValue, ambiguous)
	ch <- prometheus.MustNewConstMetric(outboxAgeDesc, prometheus.GaugeValue, outbox)
}

// oldestAges returns the ages of ageQuery, within ageTimeout.
func (s *Service) oldestAges(ctx context.Context) (ambiguous, outbox float64, err error) {
	ctx, cancel := context.WithTimeout(ctx, ageTimeout)
	defer cancel()
	if err := s.pool.QueryRow(ctx, ageQuery).Scan(&ambiguous, &outbox); err != nil {
		return 0, 0, fmt.Errorf("age query: %w", errors.Join(err, ctx.Err()))
	}
	return ambiguous, outbox, nil
}
