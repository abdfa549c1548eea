package etcdstore

import (
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// leasePool keeps etcd leases that carry no key, so that the next Acquire
// asking for the same TTL can reset one with a keep-alive (answered by the
// leader without a raft write) instead of granting a new lease (a raft
// write). A lease enters the pool only when this store has just detached it
// from its key (a Release deleted the key) or attached nothing to it (an
// Acquire lost its transaction).
//
// The pool must never hand out a lease etcd may already have expired: the
// leader revokes expired leases only every 500 ms, and until then etcd
// still attaches keys to them, so a grant on such a lease would be written
// and then deleted with it. The pool therefore keeps, for every lease this
// store granted or reset, a lower bound of the moment etcd last reset it
// (this store's clock just before the grant or keep-alive was sent; a
// renewal through another lock-server only resets it later), and hands a
// lease out only while that bound plus its TTL is at least margin(TTL)
// ahead. A lease whose last reset this store does not know (granted by
// another lock-server) is never pooled.
type leasePool struct {
	mu     sync.Mutex
	max    int                        // idle leases kept in all; 0 turns reuse off
	n      int                        // idle leases held now
	idle   map[int64][]pooledLease    // by granted TTL in whole seconds, newest last
	resets map[clientv3.LeaseID]reset // leases carrying a grant of this store
	floors map[int64]int64            // requested TTL -> TTL etcd granted, in seconds
}

// pooledLease is one idle lease; the pool hands it out until expires.
type pooledLease struct {
	id      clientv3.LeaseID
	ttl     time.Duration // granted by etcd
	expires time.Time     // last reset + ttl - margin(ttl)
}

// reset is the lower bound of a lease's last reset by etcd, and its TTL.
type reset struct {
	at  time.Time
	ttl time.Duration
}

// margin is how much life a pooled lease must have left, by the pool's
// lower bound, to be handed out: a quarter of its TTL, at most 2 s. The
// keep-alive that follows arrives within milliseconds; the margin keeps it
// clear of etcd's expiry check and of any difference in clock rates.
func margin(ttl time.Duration) time.Duration { return min(ttl/4, 2*time.Second) }

// maxResets bounds the reset records of grants that ended without a
// release through this store (expired, or released through another
// lock-server); past it, records of surely expired leases are dropped.
const maxResets = 4096

func newLeasePool(max int) *leasePool {
	return &leasePool{
		max: max, idle: make(map[int64][]pooledLease),
		resets: make(map[clientv3.LeaseID]reset), floors: make(map[int64]int64),
	}
}

// off reports whether reuse is turned off.
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

// noteReset records that etcd reset lease id, of TTL ttl, no earlier than
// at: it now carries a grant of this store.
func (p *leasePool) noteReset(id clientv3.LeaseID, ttl time.Duration, at time.Time) {
	if p.off() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.resets) >= maxResets {
		for lid, r := range p.resets {
			if !at.Before(r.at.Add(r.ttl)) {
				delete(p.resets, lid)
			}
		}
	}
	p.resets[id] = reset{at: at, ttl: ttl}
}

// forget drops what the pool knows of lease id (it was revoked).
func (p *leasePool) forget(id clientv3.LeaseID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.resets, id)
}

// putReleased pools lease id, whose key a release has just deleted, if the
// pool knows its last reset and enough of its life is left at now. It
// reports whether the lease was pooled; if not, the caller leaves it to
// expire (or revokes it when reuse is off).
func (p *leasePool) putReleased(id clientv3.LeaseID, now time.Time) bool {
	if p.off() {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.resets[id]
	delete(p.resets, id)
	return ok && p.add(id, r, now)
}

// putUnused pools lease id, reset no earlier than at and carrying no key
// (its acquire lost), on the same terms as putReleased.
func (p *leasePool) putUnused(id clientv3.LeaseID, ttl time.Duration, at, now time.Time) bool {
	if p.off() {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.add(id, reset{at: at, ttl: ttl}, now)
}

// add pools a lease when enough of its life is left, making room when the
// pool is full by forgetting the leases that expire first. p.mu is held.
func (p *leasePool) add(id clientv3.LeaseID, r reset, now time.Time) bool {
	l := pooledLease{id: id, ttl: r.ttl, expires: r.at.Add(r.ttl - margin(r.ttl))}
	if !now.Before(l.expires) {
		return false
	}
	for p.n >= p.max {
		p.evictFirstToExpire()
	}
	secs := int64(r.ttl / time.Second)
	p.idle[secs] = append(p.idle[secs], l)
	p.n++
	return true
}

// evictFirstToExpire forgets the idle lease that expires first (expired
// ones included): the pool keeps the leases with the most life left. The
// forgotten lease carries no key and expires on its own. p.mu is held.
func (p *leasePool) evictFirstToExpire() {
	var (
		first     time.Time
		firstSecs int64
		firstIdx  = -1
	)
	for secs, list := range p.idle {
		for i, l := range list {
			if firstIdx < 0 || l.expires.Before(first) {
				first, firstSecs, firstIdx = l.expires, secs, i
			}
		}
	}
	if firstIdx < 0 {
		return
	}
	list := p.idle[firstSecs]
	list = append(list[:firstIdx], list[firstIdx+1:]...)
	if len(list) == 0 {
		delete(p.idle, firstSecs)
	} else {
		p.idle[firstSecs] = list
	}
	p.n--
}

// take returns the most recently pooled lease for a request of secs
// seconds that may still be handed out at now, and forgets the leases of
// that TTL that may not.
func (p *leasePool) take(secs int64, now time.Time) (pooledLease, bool) {
	if p.off() {
		return pooledLease{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if g, ok := p.floors[secs]; ok {
		secs = g
	}
	list := p.idle[secs]
	for len(list) > 0 {
		l := list[len(list)-1]
		list = list[:len(list)-1]
		p.n--
		if now.Before(l.expires) {
			p.idle[secs] = list
			return l, true
		}
	}
	delete(p.idle, secs)
	return pooledLease{}, false
}

// len returns the number of idle leases held.
func (p *leasePool) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}
