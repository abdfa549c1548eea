package etcdstore

import (
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// leasePool keeps idle etcd leases: granted ahead of time, never attached
// to a key, so an Acquire resets one with a keep-alive (no raft write)
// instead of waiting for a grant. A lease leaves the pool for one grant and
// comes back only if that grant lost its transaction. A lease is handed out
// only while a lower bound of its remaining life (monotonic clock) is at
// least margin(TTL), since etcd still attaches keys to an expired lease
// until the leader revokes it. Grants come in batches per TTL whose size
// doubles, up to maxAhead, while no lease of that TTL expires unused, and
// halves when one does. See docs/lock-service.md.
type leasePool struct {
	mu       sync.Mutex
	max      int                     // idle leases kept in all; 0 turns the pool off
	n        int                     // idle leases held now
	inFlight int                     // grants for the pool sent and not yet answered
	idle     map[int64][]pooledLease // by granted TTL in whole seconds, newest last
	floors   map[int64]int64         // requested TTL -> TTL etcd granted, in seconds
	ahead    map[int64]*ahead        // by granted TTL in whole seconds
}

// ahead is the pool's batching state for one TTL.
type ahead struct {
	batch    int  // leases to hold, idle or being granted, after a top-up
	inFlight int  // grants of this TTL sent and not yet answered
	expired  bool // a lease expired unused since the last top-up
}

// maxAhead caps the batch of leases granted at once for one TTL.
const maxAhead = 16

// pooledLease is one idle lease; the pool hands it out until expires.
type pooledLease struct {
	id      clientv3.LeaseID
	ttl     time.Duration // granted by etcd
	expires time.Time     // last reset + ttl - margin(ttl)
}

// margin is how much life a pooled lease must have left, by the pool's
// lower bound, to be handed out: half its TTL. The keep-alive that resets
// it is sent together with the create transaction; were it to reach etcd
// more than margin late while the transaction did not, etcd could attach
// the key to a lease that then expires: a grant nobody was told of, gone
// when the leader revokes the lease (the acquire then starts again with a
// new lease). Half the TTL is 500 ms at a 1 s TTL, 1 s at etcd's default
// floor of 2 s, seconds at the usual TTLs.
func margin(ttl time.Duration) time.Duration { return ttl / 2 }

func newLeasePool(max int) *leasePool {
	return &leasePool{
		max: max, idle: make(map[int64][]pooledLease),
		floors: make(map[int64]int64), ahead: make(map[int64]*ahead),
	}
}

// granted returns the TTL etcd grants for a request of secs, as far as the
// pool knows. p.mu is held.
func (p *leasePool) grantedSecs(secs int64) int64 {
	if g, ok := p.floors[secs]; ok {
		return g
	}
	return secs
}

// aheadOf returns the batching state of TTL secs (as granted). p.mu is held.
func (p *leasePool) aheadOf(secs int64) *ahead {
	a := p.ahead[secs]
	if a == nil {
		a = &ahead{batch: 1}
		p.ahead[secs] = a
	}
	return a
}

// off reports whether the pool is turned off.
func (p *leasePool) off() bool { return p.max == 0 }

// learnFloor records that etcd granted grantedSecs for a request of secs,
// so that take looks for leases of the granted TTL (etcd raises TTLs below
// its floor).
func (p *leasePool) learnFloor(secs, grantedSecs int64) {
	if p.off() || grantedSecs == secs {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.floors[secs] = grantedSecs
}

// topUp returns how many leases of a request of secs seconds a granter is
// to grant now (see leasePool), 0 when enough are idle or being granted,
// and reserves room for them: the leases held and being granted stay
// within max. Each reserved lease must be followed by exactly one call of
// granted or ungranted with the same secs.
func (p *leasePool) topUp(secs int64) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.off() {
		return 0
	}
	a := p.aheadOf(p.grantedSecs(secs))
	have := len(p.idle[p.grantedSecs(secs)]) + a.inFlight
	if have > a.batch/2 {
		return 0
	}
	if !a.expired {
		a.batch = min(2*a.batch, maxAhead)
	}
	a.expired = false
	k := min(a.batch-have, p.max-p.n-p.inFlight)
	if k <= 0 {
		return 0
	}
	a.inFlight += k
	p.inFlight += k
	return k
}

// ungranted ends a reservation of topUp(secs) whose grant failed.
func (p *leasePool) ungranted(secs int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.aheadOf(p.grantedSecs(secs)).inFlight--
	p.inFlight--
}

// granted ends a reservation of topUp(secs): it pools lease id, of TTL
// ttl, granted by a request sent at at, if enough of its life is left at
// now. It reports whether the lease was pooled; if not, it carries no key
// and the caller leaves it to expire.
func (p *leasePool) granted(secs int64, id clientv3.LeaseID, ttl time.Duration, at, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.aheadOf(p.grantedSecs(secs)).inFlight--
	p.inFlight--
	return p.add(id, ttl, at, now)
}

// putUnused pools lease id, reset no earlier than at, which an acquire
// took from the pool or was granted and then lost its transaction with:
// it carried no key. It reports whether the lease was pooled.
func (p *leasePool) putUnused(id clientv3.LeaseID, ttl time.Duration, at, now time.Time) bool {
	if p.off() {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.add(id, ttl, at, now)
}

// add pools a lease when enough of its life is left. When the pool is
// full, the lease that expires first, this one included, is the one left
// out. p.mu is held.
func (p *leasePool) add(id clientv3.LeaseID, ttl time.Duration, at, now time.Time) bool {
	l := pooledLease{id: id, ttl: ttl, expires: at.Add(ttl - margin(ttl))}
	if !now.Before(l.expires) {
		return false
	}
	if p.n >= p.max {
		secs, i := p.firstToExpire()
		if i < 0 || !p.idle[secs][i].expires.Before(l.expires) {
			return false
		}
		p.removeAt(secs, i)
	}
	secs := int64(ttl / time.Second)
	p.idle[secs] = append(p.idle[secs], l)
	p.n++
	return true
}

// firstToExpire locates the idle lease that expires first (i < 0 when
// the pool is empty). p.mu is held.
func (p *leasePool) firstToExpire() (secs int64, i int) {
	var first time.Time
	i = -1
	for s, list := range p.idle {
		for j, l := range list {
			if i < 0 || l.expires.Before(first) {
				first, secs, i = l.expires, s, j
			}
		}
	}
	return secs, i
}

// removeAt forgets idle lease i of TTL secs; it carries no key and
// expires on its own. p.mu is held.
func (p *leasePool) removeAt(secs int64, i int) {
	list := append(p.idle[secs][:i], p.idle[secs][i+1:]...)
	if len(list) == 0 {
		delete(p.idle, secs)
	} else {
		p.idle[secs] = list
	}
	p.n--
}

// take removes and returns the most recently pooled lease for a request of
// secs seconds that may still be handed out at now, forgetting the expired
// ones (they halve the TTL's batch). A lease it returns is never pooled
// again unless the acquire attached nothing to it (putUnused).
func (p *leasePool) take(secs int64, now time.Time) (pooledLease, bool) {
	if p.off() {
		return pooledLease{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	secs = p.grantedSecs(secs)
	list := slices.DeleteFunc(p.idle[secs], func(l pooledLease) bool { return !now.Before(l.expires) })
	if dropped := len(p.idle[secs]) - len(list); dropped > 0 {
		a := p.aheadOf(secs)
		a.batch, a.expired = max(1, a.batch/2), true
		p.n -= dropped
	}
	if len(list) == 0 {
		delete(p.idle, secs)
		return pooledLease{}, false
	}
	l := list[len(list)-1]
	p.idle[secs] = list[:len(list)-1]
	p.n--
	return l, true
}

// len returns the number of idle leases held.
func (p *leasePool) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}
