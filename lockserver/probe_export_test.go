package lockserver

// HeadClaimedAwake reports whether key's head waiter has stopped sleeping
// (its wait ended, or a timer or wake fired) while a handoff to it is
// still in flight: it is waiting in unpark for the outcome. For tests only.
func (s *Server) HeadClaimedAwake(key string) bool {
	s.waitq.mu.Lock()
	defer s.waitq.mu.Unlock()
	kq := s.waitq.keys[key]
	return kq != nil && len(kq.waiters) > 0 && !kq.waiters[0].parked && kq.waiters[0].claimed
}
