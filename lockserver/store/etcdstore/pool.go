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
// another lock-server) is never pooled. These times keep Go's monotonic
// clock reading, so a step of the wall clock cannot make a lease look
// younger than it is.
type leasePool struct {
	mu     sync.Mutex
	max    int                        // idle leases kept in all; 0 turns reuse off
	n      int                        // idle leases held now
	idle   map[int64][]pooledLease    // by granted TTL in whole seconds, newest last
	resets map[clientv3.LeaseID]reset // leases carrying a grant of this store
	floors map[int64]int64            // requested TTL -> TTL etcd granted, in seconds
	prune  int                        // len(resets) at which to drop records of ended grants
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
// lower bound, to be handed out: half its TTL. The keep-alive that resets
// it is sent together with the create transaction; were it to reach etcd
// more than margin late while the transaction did not, etcd could attach
// the key to a lease that then expires: a grant nobody was told of, gone
// when the leader revokes the lease (the acquire then starts again with a
// new lease). Half the TTL is 500 ms at a 1 s TTL, 1 s at etcd's default
// floor of 2 s, seconds at the usual TTLs.
func margin(ttl time.Duration) time.Duration { return ttl / 2 }

// minPrune is the number of reset records from which noteReset drops the
// records of grants that surely ended without a release through this
// store (expired, or released through another lock-server). After a pass,
// the next is due at twice the records left, so the cost stays constant
// per call however many grants are live.
const minPrune = 4096

func newLeasePool(max int) *leasePool {
	return &leasePool{
		max: max, idle: make(map[int64][]pooledLease),
		resets: make(map[clientv3.LeaseID]reset), floors: make(map[int64]int64),
		prune: minPrune,
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
	if len(p.resets) >= p.prune {
		for lid, r := range p.resets {
			if !at.Before(r.at.Add(r.ttl)) {
				delete(p.resets, lid)
			}
		}
		p.prune = max(minPrune, 2*len(p.resets))
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

// add pools a lease when enough of its life is left. When the pool is
// full, the lease that expires first, this one included, is the one left
// out. p.mu is held.
func (p *leasePool) add(id clientv3.LeaseID, r reset, now time.Time) bool {
	l := pooledLease{id: id, ttl: r.ttl, expires: r.at.Add(r.ttl - margin(r.ttl))}
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
	secs := int64(r.ttl / time.Second)
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

// take returns the most recently pooled lease for a request of secs
// seconds that may still be handed out at now, forgetting the expired ones
// it passes on the way.
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
