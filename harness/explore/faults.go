package explore

// Faults: what the explorer injects between steps, which of them a
// decision offers (enabled) and what each does (take). The adversarial
// holder's own faults are in adversary.go.

import (
	"context"
	"fmt"
	"slices"
	"time"

	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// Faults the explorer injects between steps.
const (
	// FaultExpire ends the live lease on the server's clock.
	FaultExpire = "expire"
	// FaultRevoke revokes the live lease, as an operator would.
	FaultRevoke = "revoke"
	// FaultRailLost is taken instead of a holder's StepRail ("A:lost"):
	// the rail pays and its answer to rail-proxy is lost (rail-proxy
	// records the attempt ambiguous).
	FaultRailLost = "lost"
	// FaultRailDown is taken instead of a holder's StepRail ("A:down"):
	// the call never reaches the rail, and rail-proxy cannot tell that from
	// a lost answer (ambiguous too).
	FaultRailDown = "down"
	// FaultRailRefused is taken instead of a holder's StepRail
	// ("A:refused"): the rail refuses the call and says it recorded
	// nothing (rail-stub's 503 RAIL_UNAVAILABLE), which rail-proxy answers
	// RAIL_NOT_REACHED and the executor redelivers. Offered only when a
	// Config's Faults name it.
	FaultRailRefused = "refused"
	// FaultCrash is taken instead of any held step of a holder ("A:crash",
	// never at StepRail, where the call is rail-proxy's): the process dies
	// there. Nothing more leaves it; its lease ends by its TTL.
	FaultCrash = "crash"
	// FaultGiveUp is taken instead of a holder's StepRail ("A:giveup"):
	// the holder's own timeout cuts its call to rail-proxy, while
	// rail-proxy's call to the rail stays held. That call becomes
	// rail-proxy's pending step ("P:rail", or "P:lost", "P:down"), which
	// the explorer lets go whenever it likes, for example after the
	// reconciler has looked the payout up.
	FaultGiveUp = "giveup"
	// FaultAge is not a fault but time passing: every rail attempt of the
	// run becomes older than rail-proxy's abandon threshold, so that the
	// reconciler may reconcile an attempt in doubt. Offered once per
	// schedule, with the reconciler, while an attempt is in doubt, also
	// while a rail call is still held (harness/README.md).
	FaultAge = "age"
	// FaultForge is taken instead of a holder's StepSubmit ("A:forge"),
	// once per holder: the holder, whose lease is real, first sends its
	// submission with altered terms (adversary.go: another amount,
	// another account, another payout's signature, a signature that is
	// not payment-resource's), each with its own token and proof; then it
	// is back at StepSubmit with its genuine submission. Each forged
	// submission must be refused 403 with nothing recorded at rail-proxy.
	FaultForge = "forge"
	// FaultResend ("A:resend"): a copy of the holder's last submission,
	// same token, proof and terms, reaches rail-proxy again (the holder's
	// client retried it, or the network duplicated it), at any later
	// point of the schedule, once per holder. Its answer reaches nobody;
	// its rail call, if rail-proxy makes one, is rail-proxy's pending step
	// ("P:rail", "P:refused", ...), as after FaultGiveUp.
	FaultResend = "resend"
	// FaultReject is taken instead of a holder's StepSubmit ("A:reject"):
	// the submission is refused for good before rail-proxy records
	// anything (the explorer answers 400 INVALID_REQUEST in its place,
	// as rail-proxy answers a request no retry can change), so the holder
	// marks the payout needs_attention, and the reconciler closes a
	// payout that was never forwarded.
	FaultReject = "reject"
	// FaultRestart restarts a lock-server replica ("L1:restart",
	// "L2:restart"): its Server is closed and a new one, over a newly
	// opened store on the same lock store, serves at its URL
	// (pipelinetest.Pipeline.RestartLock). It forgets the token floor it
	// kept; the leases and the token counter are the store's. A request
	// held for that replica reaches the new Server. Offered once per
	// schedule, after the first grant, while something else may still
	// happen.
	FaultRestart = "restart"
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

// enabled lists the choices open at this decision: each held actor's
// step, the faults cfg allows while its budget lasts, and rail-proxy's
// held call. Empty when the schedule is over. When every actor left waits
// for a lease whose holder is done, the lease's expiry is the only choice
// (and is not counted as a fault).
func (r *run) enabled(ctx context.Context, s *sched, live bool) ([]Choice, error) {
	cfg := s.cfg
	var enabled []Choice
	waiting := false
	for _, h := range s.actors {
		a := s.pending[h]
		if h == reconcilerIndex && a.err != nil {
			return nil, fmt.Errorf("explore: the reconciler: %w", a.err) // a read that failed
		}
		switch {
		case a.step == stepDone:
		case a.step == StepAcquire && live:
			waiting = true
		default:
			enabled = append(enabled, Choice{Holder: holderName(h), Step: a.step})
			if s.faults < cfg.MaxFaults {
				if a.step == StepRail {
					for _, f := range []string{FaultRailLost, FaultRailDown, FaultRailRefused, FaultGiveUp} {
						if slices.Contains(cfg.Faults, f) && (f != FaultGiveUp || s.proxyCall == nil) {
							enabled = append(enabled, Choice{Holder: holderName(h), Step: f})
						}
					}
				} else {
					if a.step == StepSubmit && h != reconcilerIndex {
						for _, f := range []string{FaultForge, FaultReject} {
							if slices.Contains(cfg.Faults, f) && (f != FaultForge || !r.doers[h].forged) {
								enabled = append(enabled, Choice{Holder: holderName(h), Step: f})
							}
						}
					}
					if slices.Contains(cfg.Faults, FaultCrash) {
						enabled = append(enabled, Choice{Holder: holderName(h), Step: FaultCrash})
					}
				}
			}
		}
	}
	if s.proxyCall != nil {
		enabled = append(enabled, Choice{Holder: RailProxy, Step: StepRail})
		for _, f := range []string{FaultRailLost, FaultRailDown, FaultRailRefused} {
			if s.faults < cfg.MaxFaults && slices.Contains(cfg.Faults, f) {
				enabled = append(enabled, Choice{Holder: RailProxy, Step: f})
			}
		}
	}
	if live && s.faults < cfg.MaxFaults {
		for _, f := range cfg.Faults {
			if f == FaultExpire || f == FaultRevoke {
				enabled = append(enabled, Choice{Step: f})
			}
		}
	}
	if cfg.Reconciler && !s.aged && s.pending[reconcilerIndex].step != stepDone {
		doubt, err := r.inDoubt(ctx)
		if err != nil {
			return nil, err
		}
		if doubt {
			enabled = append(enabled, Choice{Step: FaultAge})
		}
	}
	// A resend is offered while something else may still happen (it
	// never is the only choice, or every schedule would end with one).
	if len(enabled) > 0 && s.proxyCall == nil && s.faults < cfg.MaxFaults && slices.Contains(cfg.Faults, FaultResend) {
		for _, h := range s.actors {
			if d := r.doers[h]; h != reconcilerIndex && d.sent() && !d.resent {
				enabled = append(enabled, Choice{Holder: holderName(h), Step: FaultResend})
			}
		}
	}
	// So is a restart, once there is a token floor to forget.
	if len(enabled) > 0 && !s.restarted && s.faults < cfg.MaxFaults && slices.Contains(cfg.Faults, FaultRestart) && r.granted() {
		for i := range r.e.p.LockURLs {
			enabled = append(enabled, Choice{Holder: replicaName(i), Step: FaultRestart})
		}
	}
	if len(enabled) == 0 && waiting {
		// Everyone left waits for a lease whose holder is done (its
		// release failed, or it crashed): it ends by its TTL. Not a
		// fault.
		enabled = append(enabled, Choice{Step: FaultExpire})
		s.faults--
	}
	return enabled, nil
}

// take carries out choice c, the last of s.res.Schedule: a fault on the
// lock or a lock-server replica, rail-proxy's held call, a resend, or an
// actor's step (or its fault in place of the step), after which it waits
// until that actor is held again or done. state is the lock as it was
// when c was chosen.
func (r *run) take(ctx, runCtx context.Context, s *sched, c Choice, state store.State) error {
	at := len(s.res.Schedule) - 1
	if c.Holder == "" {
		var tok int64
		switch c.Step {
		case FaultAge:
			s.aged = true
			return r.age(ctx)
		case FaultExpire:
			tok = state.Lease.Token
			r.e.p.LockClock.Advance(ttl + time.Millisecond)
		case FaultRevoke:
			l, err := r.e.p.Locks.Revoke(ctx, r.events[0].LockKey(), 0)
			if err != nil {
				return fmt.Errorf("explore: revoke: %w", err)
			}
			tok = l.Token
		}
		s.faults++
		s.ended = append(s.ended, endedLease{index: at, token: tok})
		return nil
	}
	if c.Step == FaultRestart {
		// Nothing is in flight at lock-server between two choices.
		s.restarted = true
		s.faults++
		i := replicaIndex(c.Holder)
		if err := r.e.p.RestartLock(i); err != nil {
			return fmt.Errorf("explore: restart %s: %w", c.Holder, err)
		}
		r.mu.Lock()
		r.restarted = i
		r.mu.Unlock()
		return nil
	}
	h := holderIndex(c.Holder)
	switch c.Step {
	case FaultCrash, FaultRailLost, FaultRailDown, FaultRailRefused, FaultGiveUp, FaultForge, FaultResend, FaultReject:
		s.faults++
	}
	s.steps = append(s.steps, stepRecord{index: at, holder: h, step: c.Step})
	if h == railProxyIndex {
		// The call its caller gave up on goes on; rail-proxy records
		// what came of it before the next choice.
		if err := r.letProxyGo(ctx, s.proxyCall, c.Step); err != nil {
			return err
		}
		s.proxyCall = nil
		return nil
	}
	if c.Step == FaultResend {
		// A copy of h's submission reaches rail-proxy; h stays where
		// it is. A rail call it causes is rail-proxy's pending step.
		r.doers[h].resent = true
		call, err := r.resend(ctx, runCtx, h)
		if err != nil {
			return err
		}
		s.proxyCall = call
		return nil
	}
	if c.Step == FaultForge {
		r.doers[h].forged = true
	}
	r.running.Store(int32(h))
	if c.Step == FaultGiveUp {
		// The rail call stays held, now as rail-proxy's; the holder's
		// own call is cut and it goes on from there.
		s.proxyCall = &arrival{holder: railProxyIndex, step: StepRail, resume: s.pending[h].resume}
		r.detached.Store(int32(h))
		r.doers[h].giveUp()
	} else {
		select {
		case s.pending[h].resume <- c.Step:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if c.Step == FaultCrash {
		s.kill[h]()
	}
	// The actor runs until its next held step, or to its end (a
	// crashed one fails every call from now on without arriving).
	select {
	case a := <-r.arrive:
		if a.holder != h {
			return fmt.Errorf("explore: %s arrived while %s was running", holderName(a.holder), c.Holder)
		}
		if c.Step == FaultCrash && a.step != stepDone {
			return fmt.Errorf("explore: %s crashed, yet arrived at %s", c.Holder, a.step)
		}
		s.pending[h] = a
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}
