package paymentresource_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
)

// gather returns payment-resource's metric families by name, as a scrape
// of its process sees them.
func gather(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewRegistry()
	for _, c := range paymentresource.Collectors() {
		if err := reg.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

// gauge reads the one unlabelled gauge name, failing when it is absent.
func gauge(t *testing.T, name string) float64 {
	t.Helper()
	f, ok := gather(t)[name]
	if !ok || len(f.GetMetric()) != 1 || len(f.GetMetric()[0].GetLabel()) != 0 {
		t.Fatalf("%s: %v; want one unlabelled gauge", name, f)
	}
	return f.GetMetric()[0].GetGauge().GetValue()
}

// completionHistogram returns payout_completion_seconds' count and its
// cumulative count at le=60 (the SLO's threshold).
func completionHistogram(t *testing.T) (count, within60 uint64) {
	t.Helper()
	f, ok := gather(t)["payout_completion_seconds"]
	if !ok || len(f.GetMetric()) != 1 {
		t.Fatalf("payout_completion_seconds: %v; want one histogram", f)
	}
	h := f.GetMetric()[0].GetHistogram()
	for _, b := range h.GetBucket() {
		if b.GetUpperBound() == 60 {
			return h.GetSampleCount(), b.GetCumulativeCount()
		}
	}
	t.Fatal("payout_completion_seconds has no bucket at 60 s")
	return 0, 0
}

// createdCount reads payouts_created_total.
func createdCount(t *testing.T) float64 {
	t.Helper()
	f, ok := gather(t)["payouts_created_total"]
	if !ok || len(f.GetMetric()) != 1 || len(f.GetMetric()[0].GetLabel()) != 0 {
		t.Fatalf("payouts_created_total: %v; want one unlabelled counter", f)
	}
	return f.GetMetric()[0].GetCounter().GetValue()
}

// A payout is counted created once: its replay, a creation refused and a
// list of payouts (the same path, GET) are not counted, so that
// PayoutsNotCompleting sees only payouts that wait to complete.
// (Not parallel: the counter is the process's.)
func TestPayoutCreationIsCountedOnceAndListingIsNot(t *testing.T) {
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 100)
	n0 := createdCount(t)

	f.createPayout("p-1", "acct-1", 60, "EUR")
	if n := createdCount(t); n != n0+1 {
		t.Fatalf("after one payout created: +%v; want +1", n-n0)
	}
	body := `{"payoutId":"p-1","accountId":"acct-1","amountMinor":60,"currency":"EUR"}`
	st, got := f.do("POST", api.PathPayouts, body)
	want(t, "create p-1 again", st, got, http.StatusOK, "")
	st, got = f.do("POST", api.PathPayouts, `{"payoutId":"p-2","accountId":"acct-1","amountMinor":60,"currency":"EUR"}`)
	want(t, "create p-2 above the balance", st, got, http.StatusConflict, api.CodeInsufficientFunds)
	for range 3 {
		st, got = f.do("GET", api.ListPath(api.StateClaimed, 0, ""), "")
		want(t, "list claimed payouts", st, got, http.StatusOK, "")
	}
	if n := createdCount(t); n != n0+1 {
		t.Fatalf("after a replay, a refusal and three lists: +%v; want +1 (none of them creates a payout)", n-n0)
	}
}

// A payout that finishes is observed once, from its creation: one created
// 90 s before its ACK lands above the SLO's 60 s bucket, one declined at
// once lands in it, and the result sent again is not observed twice.
// (Not parallel: the histogram is the process's.)
func TestPayoutCompletionIsObservedOnceFromCreation(t *testing.T) {
	f := newFixture(t, newPublisher(nil))
	f.createAccount("acct-1", "EUR", 1_000_000)
	f.createPayout("p-slow", "acct-1", 100, "EUR")
	f.createPayout("p-fast", "acct-1", 100, "EUR")
	if _, err := f.db.Exec(context.Background(), `UPDATE payout SET created_at = now() - interval '90 seconds' WHERE payout_id = 'p-slow'`); err != nil {
		t.Fatal(err)
	}
	count0, in0 := completionHistogram(t)

	st, body := f.claim("p-slow", 1, "w")
	want(t, "claim p-slow", st, body, http.StatusOK, "")
	st, body = f.result("p-slow", 1, "w", string(api.OutcomeAck), "rail-1")
	want(t, "ACK p-slow", st, body, http.StatusOK, "")
	if count, in := completionHistogram(t); count != count0+1 || in != in0 {
		t.Fatalf("after a payout posted 90 s after its creation: count %d (+%d), le=60 %d (+%d); want +1, +0", count, count-count0, in, in-in0)
	}
	st, body = f.result("p-slow", 1, "w", string(api.OutcomeAck), "rail-1")
	want(t, "ACK p-slow again", st, body, http.StatusOK, "")
	st, body = f.claim("p-fast", 2, "w")
	want(t, "claim p-fast", st, body, http.StatusOK, "")
	st, body = f.result("p-fast", 2, "w", string(api.OutcomeDecline), "rail-2")
	want(t, "DECLINE p-fast", st, body, http.StatusOK, "")
	if count, in := completionHistogram(t); count != count0+2 || in != in0+1 {
		t.Fatalf("after the replay and a payout declined at once: count +%d, le=60 +%d; want +2 (the replay is not counted), +1", count-count0, in-in0)
	}
}

// The ages are read from paydb at the scrape: 0 with nothing waiting, then
// the age of an outbox row the broker never took and of a payout left
// ambiguous. (Not parallel: the gauges report every Service of the
// process.)
func TestOldestAgesAreReadFromPaydbAtTheScrape(t *testing.T) {
	f := newFixture(t, newPublisher(errors.New("broker down")))
	if a, o := gauge(t, "payouts_ambiguous_oldest_age_seconds"), gauge(t, "payment_outbox_oldest_unpublished_age_seconds"); a != 0 || o != 0 {
		t.Fatalf("empty paydb: ambiguous %v, outbox %v; want 0, 0", a, o)
	}
	f.createAccount("acct-1", "EUR", 1_000_000)
	f.createPayout("p-1", "acct-1", 100, "EUR")
	st, body := f.claim("p-1", 1, "w")
	want(t, "claim", st, body, http.StatusOK, "")
	st, body = f.result("p-1", 1, "w", string(api.OutcomeAmbiguous), "")
	want(t, "AMBIGUOUS", st, body, http.StatusOK, "")
	for _, q := range []string{
		`UPDATE outbox SET created_at = now() - interval '10 minutes'`,
		`UPDATE payout SET updated_at = now() - interval '40 minutes' WHERE payout_id = 'p-1'`,
	} {
		if _, err := f.db.Exec(context.Background(), q); err != nil {
			t.Fatal(err)
		}
	}
	if o := gauge(t, "payment_outbox_oldest_unpublished_age_seconds"); o < 600 || o > 900 {
		t.Errorf("outbox age %v; want the unpublished row's 600 s and some", o)
	}
	if a := gauge(t, "payouts_ambiguous_oldest_age_seconds"); a < 2400 || a > 2700 {
		t.Errorf("ambiguous age %v; want the payout's 2400 s and some", a)
	}
}
