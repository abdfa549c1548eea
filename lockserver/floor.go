package lockserver

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// The token floor: the second line of the restore guard, behind the
// identity stamps of the stores (see docs/runbooks/lockdb-restore.md).
//
// Both backends mint tokens from one counter per backend (PostgreSQL's
// sequence, etcd's revision), so a grant that starts after another grant's
// answer came back must get a larger token than that grant, whatever the
// keys. A Server remembers the largest token it has handed out; an acquire
// whose token is not above the value it read before sending the request
// (read again by the Batcher as it sends a request that waited in its
// queue: withSendNote) proves that the backend went back in time (a
// snapshot restored in place, which keeps every identity fact), and is
// withdrawn and refused with ErrBackendRestored. For that a batch's
// grants must be in the floor before the next batch is sent: the Batcher
// notes them (onGrant) before it answers the batch's callers or hands the
// lead on, since a caller notes its own grant only once it has run
// again. The floor lives in this
// process only: it protects the tokens this lock-server issued, not those
// issued through another one, and it is empty after a restart. Its value
// is published as the gauge lockserver_highest_token_issued, which
// Prometheus keeps across restores: the figure an operator needs for
// "lockctl advance --past N".

// metricHighestTokenIssued is the name of the gauge of the token floor.
const metricHighestTokenIssued = "lockserver_highest_token_issued"

// noteIssued raises the floor to token.
func (s *Server) noteIssued(token int64) {
	for {
		cur := s.issued.Load()
		if token <= cur || s.issued.CompareAndSwap(cur, token) {
			return
		}
	}
}

// withdraw ends the grant l, whose token is not above floor, before anyone
// hears of it, and returns the refusal. The revoke is conditional on l's
// token, so it can end nothing else; if it fails, the lease expires after
// its TTL and nobody holds it.
func (s *Server) withdraw(ctx context.Context, l store.Lease, floor int64) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.RequestTimeout)
	defer cancel()
	if _, err := s.store.Revoke(rctx, l.Key, l.Token); err != nil {
		s.log.WarnContext(ctx, "withdrawing a grant with a repeated token failed; it expires after its TTL",
			"event", EventGrantWithdrawFailed, "key", l.Key, "token", l.Token, "error", err.Error())
	}
	return fmt.Errorf("%w: the backend granted key %q with token %d, not above token %d that this lock-server issued before; the grant was withdrawn",
		store.ErrBackendRestored, l.Key, l.Token, floor)
}

// registerFloor publishes the floor on reg.
func (s *Server) registerFloor(reg prometheus.Registerer) error {
	return reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: metricHighestTokenIssued,
		Help: "Largest fencing token this lock-server has handed out since it started (0: none). Its maximum over time is the N of \"lockctl advance --past N\" after a restore.",
	}, func() float64 { return float64(s.issued.Load()) }))
}
