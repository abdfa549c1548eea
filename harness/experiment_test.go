package harness_test

import (
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/harness"
)

// TestStaleHolderMatrixOnRealProcesses is the fencing argument on a stack
// of real processes: for each fencing cell, on one backend (both with
// -matrix.full, make test-full; see backendsOf), worker A is stopped with
// SIGSTOP after its last lease confirmation, its lease expires on the
// server, B completes the payout, A is continued. The outcome is read
// from the rail-stub and the ledger; the expectations are those of
// functions/e2e's in-process TestStaleHolderMatrix. The runs are shared
// with TestFixtures (see runOf).
func TestStaleHolderMatrixOnRealProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, etcd, Pub/Sub and every service as processes")
	}
	want := map[string]struct {
		rail, debits int
		balanced     bool
		fenced       string // resource of the fenced_out event, "" for none
	}{
		"both-on":      {1, 1, true, "rail"},
		"payment-only": {2, 1, false, "payout"},
		"rail-only":    {1, 1, true, "rail"},
		"both-off":     {2, 2, false, ""},
	}
	for _, cell := range harness.Cells {
		for _, backend := range backendsOf(cell) {
			t.Run(backend+"/"+cell.Name(), func(t *testing.T) {
				r := runOf(t, backend, cell)
				got, w := r.Summary, want[cell.Name()]
				if got.RailSubmissions != w.rail || got.Debits != w.debits || got.LedgerBalanced != w.balanced {
					t.Errorf("railSubmissions %d, debits %d, ledgerBalanced %v; want %d, %d, %v\n%s",
						got.RailSubmissions, got.Debits, got.LedgerBalanced, w.rail, w.debits, w.balanced, harness.Transcript(r))
				}
				if got.TokenB <= got.TokenA {
					t.Errorf("token B %d is not greater than token A %d", got.TokenB, got.TokenA)
				}
				if w.fenced == "" {
					if len(got.FencedOut) != 0 {
						t.Errorf("fencedOut %v with both fences off; want none", got.FencedOut)
					}
					return
				}
				if len(got.FencedOut) != 1 {
					t.Fatalf("fencedOut %v; want exactly one, from %s", got.FencedOut, w.fenced)
				}
				f := got.FencedOut[0]
				if f.Resource != w.fenced || f.PresentedToken != got.TokenA || f.HighestToken != got.TokenB || f.PresentedToken >= f.HighestToken {
					t.Errorf("fenced_out %+v; want resource %s, presentedToken %d (A) < highestToken %d (B)", f, w.fenced, got.TokenA, got.TokenB)
				}
			})
		}
	}
}
