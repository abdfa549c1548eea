package paymentresource

import (
	"context"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TraceRequests makes the requests s serves reach paydb through a new
// pool, like s's, whose connections report to tracer (the outbox keeps its
// own pool); the new pool is closed with s. Call it before s serves.
func TraceRequests(ctx context.Context, s *Service, tracer pgx.QueryTracer) error {
	cfg := s.pool.Config()
	cfg.ConnConfig.Tracer = tracer
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	closeOld := s.closePool
	s.pool, s.closePool = p, func() { p.Close(); closeOld() }
	return nil
}

// RememberClaim makes s remember p's terms as those of a payout it
// claimed (claimedTerms), right or wrong.
func RememberClaim(s *Service, p api.Payout) { s.claimed.put(p) }

// RemembersClaim reports whether s remembers the terms of payout id.
func RemembersClaim(s *Service, id string) bool {
	_, ok := s.claimed.get(id)
	return ok
}
