package explore

import (
	"context"

	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
)

// inDoubt reports whether a rail attempt of the run's account is
// forwarding or ambiguous.
func (r *run) inDoubt(ctx context.Context) (bool, error) {
	var n int
	err := r.e.p.RailDB.QueryRow(ctx, `SELECT count(*) FROM rail_attempt WHERE account_id = $1 AND state = ANY($2)`,
		r.events[0].AccountID, []string{string(railapi.StateForwarding), string(railapi.StateAmbiguous)}).Scan(&n)
	return n > 0, err
}

// age makes every rail attempt of the run's account older than
// rail-proxy's abandon threshold, on raildb's clock.
func (r *run) age(ctx context.Context) error {
	_, err := r.e.p.RailDB.Exec(ctx, `UPDATE rail_attempt SET created_at = created_at - interval '1 day' WHERE account_id = $1`, r.events[0].AccountID)
	return err
}

// granted reports whether lock-server has granted anything in the run.
func (r *run) granted() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.grants) > 0
}

// letProxyGo lets rail-proxy's held rail call a go with the rail's
// answer mode (StepRail, FaultRailLost, FaultRailDown), and waits until
// rail-proxy has handled the outcome.
func (r *run) letProxyGo(ctx context.Context, a *arrival, mode string) error {
	select {
	case a.resume <- mode:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-r.proxyDone:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
