package lockserver

import "github.com/prometheus/client_golang/prometheus"

// HeadParked reports whether key's head waiter sleeps between two asks,
// so that a release now would be handed to it (waitqueue.go). For tests
// only.
func (s *Server) HeadParked(key string) bool {
	s.waitq.mu.Lock()
	defer s.waitq.mu.Unlock()
	kq := s.waitq.keys[key]
	return kq != nil && len(kq.waiters) > 0 && kq.waiters[0].parked && !kq.waiters[0].claimed
}

// HandoffCounter is lockserver_handoffs_total (nil without a Registry).
// For tests only.
func (s *Server) HandoffCounter() *prometheus.CounterVec { return s.handoffs }

// AbandonedCounter is lockserver_abandoned_grants_total (nil without a
// Registry). For tests only.
func (s *Server) AbandonedCounter() *prometheus.CounterVec { return s.abandonedGrants }

// HeadAwaitsHandoff reports whether key's head waiter has ended its sleep
// (woken, its timer or its wait over) while a handoff claimed it, and
// waits for that handoff's outcome (waitqueue.go unpark). For tests only.
func (s *Server) HeadAwaitsHandoff(key string) bool {
	s.waitq.mu.Lock()
	defer s.waitq.mu.Unlock()
	kq := s.waitq.keys[key]
	return kq != nil && len(kq.waiters) > 0 && !kq.waiters[0].parked && kq.waiters[0].claimed
}

// SetOnGrant sets the Batcher's onGrant hook (a Server sets it to its
// token floor). For tests only.
func (b *Batcher) SetOnGrant(f func(token int64)) { b.onGrant = f }
