package railstub_test

import (
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
)

// counts reads rail_submissions_total and rail_duplicate_submissions_total.
func counts(t *testing.T) (subs, dups float64) {
	t.Helper()
	cs := railstub.Collectors()
	if len(cs) != 2 {
		t.Fatalf("%d collectors; want rail_submissions_total and rail_duplicate_submissions_total", len(cs))
	}
	reg := prometheus.NewRegistry()
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"rail_submissions_total", "rail_duplicate_submissions_total"} {
		if n, err := testutil.GatherAndCount(reg, name); err != nil || n != 1 {
			t.Fatalf("%s: %d series, %v; want one, unlabelled", name, n, err)
		}
	}
	return testutil.ToFloat64(cs[0]), testutil.ToFloat64(cs[1])
}

// The rail counts what its journal records: every submission, and those
// of a payout id it already has (INV-04 broken), including an id reloaded
// from the journal after a restart. A refused submission counts nothing.
func TestRailCountsSubmissionsAndDuplicatesFromItsJournal(t *testing.T) {
	cfg := railstub.DefaultConfig()
	cfg.JournalPath = filepath.Join(t.TempDir(), "rail.jsonl")
	s := newStub(t, cfg)
	subs0, dups0 := counts(t)
	answerOf(t, do(s, "POST", rail.PathSubmit, okBody))
	answerOf(t, do(s, "POST", rail.PathSubmit, `{"payoutId":"po-2","accountId":"acct-1","amountMinor":2500,"currency":"EUR","reference":"po-2"}`))
	if subs, dups := counts(t); subs != subs0+2 || dups != dups0 {
		t.Fatalf("two payouts: submissions +%v, duplicates +%v; want +2, +0", subs-subs0, dups-dups0)
	}
	if rec := do(s, "POST", rail.PathSubmit, `{"payoutId":"po-1"}`); rec.Code != 400 {
		t.Fatalf("bad submission answered %d; want 400", rec.Code)
	}
	answerOf(t, do(s, "POST", rail.PathSubmit, okBody))
	if subs, dups := counts(t); subs != subs0+3 || dups != dups0+1 {
		t.Fatalf("po-1 again: submissions +%v, duplicates +%v; want +3, +1", subs-subs0, dups-dups0)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// After a restart the journal still knows po-2.
	s = newStub(t, cfg)
	answerOf(t, do(s, "POST", rail.PathSubmit, `{"payoutId":"po-2","accountId":"acct-1","amountMinor":2500,"currency":"EUR","reference":"po-2"}`))
	if subs, dups := counts(t); subs != subs0+4 || dups != dups0+2 {
		t.Fatalf("po-2 after a restart: submissions +%v, duplicates +%v; want +4, +2", subs-subs0, dups-dups0)
	}
}
