package soak

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/reconciler"
	"github.com/distributed-lock-lab/distributed-lock-lab/harness/drive"
)

// settlePoll is the pause between two looks at the records while the
// pipeline settles.
const settlePoll = 250 * time.Millisecond

// stateCounts counts paydb's payouts by state.
func stateCounts(ctx context.Context, paydb *pgxpool.Pool) (map[string]int, error) {
	rows, err := paydb.Query(ctx, `SELECT state, count(*) FROM payout WHERE payout_id LIKE 'soak-%' GROUP BY state`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			return nil, err
		}
		out[s] = n
	}
	return out, rows.Err()
}

// inFlight counts the payouts an executor still has to finish: pending,
// claimed, submitted or acknowledged.
func inFlight(c map[string]int) int {
	return c[string(api.StatePending)] + c[string(api.StateClaimed)] + c[string(api.StateSubmitted)] + c[string(api.StateAcknowledged)]
}

// settle waits until the executors have finished every payout they can
// (re-publishing the events of payouts that stopped moving, as an
// operator redrives dead-lettered messages), then runs reconciler passes
// until nothing is ambiguous, no payout in doubt has an attempt
// forwarding, and a pass changes nothing. Attempts left forwarding under
// payouts that are already final are listed in
// Report.ForwardingOfFinishedPayouts: no pass can finish them.
// ErrNotSettled when cfg.SettleTimeout passes first.
func settle(ctx context.Context, cfg Config, ld *loader, rep *Report, log *slog.Logger) error {
	sctx, cancel := context.WithTimeout(ctx, cfg.SettleTimeout)
	defer cancel()
	tick := time.NewTicker(settlePoll)
	defer tick.Stop()
	wait := func() error {
		select {
		case <-sctx.Done():
			return sctx.Err()
		case <-tick.C:
			return nil
		}
	}
	notSettled := func(what string, c map[string]int) error {
		return fmt.Errorf("%w within %v: %s (payouts by state %v)", ErrNotSettled, cfg.SettleTimeout, what, c)
	}

	// 1. The executors drain what Pub/Sub still delivers.
	var counts map[string]int
	lastLeft, lastMove := -1, time.Now()
	for {
		c, err := stateCounts(sctx, ld.d.PayDB)
		if err != nil {
			if sctx.Err() != nil {
				return notSettled("draining", counts)
			}
			return err
		}
		counts = c
		left := inFlight(c)
		if left == 0 {
			break
		}
		if left != lastLeft {
			lastLeft, lastMove = left, time.Now()
		} else if time.Since(lastMove) > cfg.StallTimeout {
			n, err := redrive(sctx, ld)
			if err != nil {
				return err
			}
			rep.Redriven += n
			log.Warn("payouts stopped moving; their events published again (a redrive)", "payouts", n, "byState", c)
			lastMove = time.Now()
		}
		if wait() != nil {
			return notSettled("draining", counts)
		}
	}
	rep.DrainedAt = time.Now()
	log.Info("executors drained", "byState", counts, "redriven", rep.Redriven)

	// 2. The reconciler settles what is in doubt.
	for {
		pr, err := drive.Reconcile(sctx, ld.d.Stack().ReconcilerURL())
		if err == nil {
			rep.ReconcilerPasses++
			for k, v := range pr.Results {
				if rep.ReconcilerResults == nil {
					rep.ReconcilerResults = map[string]int{}
				}
				rep.ReconcilerResults[string(k)] += v
			}
		}
		c, cerr := stateCounts(sctx, ld.d.PayDB)
		fwd, stuck, ferr := forwarding(sctx, ld.d)
		if err == nil && cerr == nil && ferr == nil {
			counts = c
			rep.LastPass = pr.Results
			rep.ForwardingOfFinishedPayouts = stuck
			if c[string(api.StateAmbiguous)] == 0 && inFlight(c) == 0 && len(fwd) == 0 && !progressed(pr) {
				return nil
			}
		}
		if wait() != nil {
			return notSettled(fmt.Sprintf("reconciling (payouts in doubt with an attempt forwarding: %d)", len(fwd)), counts)
		}
	}
}

// progressed reports whether a pass settled a payout or left one for a
// later pass that may settle it.
func progressed(pr reconciler.PassReport) bool {
	for r, n := range pr.Results {
		switch r {
		case reconciler.ResultNotForwarded, reconciler.ResultRailSubmittedTwice, reconciler.ResultAlreadyDone:
		default:
			if n > 0 {
				return true
			}
		}
	}
	return false
}

// forwarding returns the payouts whose rail-proxy attempt is still
// forwarding in raildb (sent, or about to be sent, to the rail with no
// answer recorded), split by their state in paydb: inDoubt for those not
// final yet (the reconciler will settle them), stuck for those already
// posted, declined or failed (their attempt is never finished by any
// process: see docs/reliability.md, "Crash soak").
func forwarding(ctx context.Context, d *drive.Driver) (inDoubt, stuck []string, err error) {
	rows, err := d.RailDB.Query(ctx, `SELECT DISTINCT payout_id FROM rail_attempt WHERE state = 'forwarding' ORDER BY payout_id`)
	if err != nil {
		return nil, nil, err
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, nil, err
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	for _, id := range ids {
		var state string
		if err := d.PayDB.QueryRow(ctx, `SELECT state FROM payout WHERE payout_id = $1`, id).Scan(&state); err != nil {
			return nil, nil, fmt.Errorf("payout %s of a forwarding attempt: %w", id, err)
		}
		switch api.State(state) {
		case api.StatePosted, api.StateDeclined, api.StateFailed:
			stuck = append(stuck, id)
		default:
			inDoubt = append(inDoubt, id)
		}
	}
	return inDoubt, stuck, nil
}

// redrive publishes again the events of the payouts still pending or
// claimed and returns how many.
func redrive(ctx context.Context, ld *loader) (int, error) {
	rows, err := ld.d.PayDB.Query(ctx, `SELECT payout_id FROM payout WHERE payout_id LIKE 'soak-%' AND state IN ('pending', 'claimed')`)
	if err != nil {
		return 0, err
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, err
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	for _, id := range ids {
		p, ok := ld.byID(id)
		if !ok {
			continue
		}
		if err := ld.d.Publish(ctx, p.event()); err != nil {
			return 0, err
		}
	}
	return len(ids), nil
}
