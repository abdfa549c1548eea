package etcdstore

import (
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// leasePool keeps idle etcd leases: leases granted ahead of time that
// have never carried a key, so that an Acquire asking for their TTL can
// reset one with a keep-alive (answered by the leader without a raft
// write) instead of waiting for a grant (a raft write). A lease is used for
// at most one grant: it enters the pool when the store's granters have
// just granted it, or when an Acquire took it and lost its transaction
// (attaching nothing to it); a lease that carried a grant never comes back.
// So a lease id names one grant for its whole life (see Leases in the
// package doc).
//
// The pool must never hand out a lease etcd may already have expired: the
// leader revokes expired leases only every 500 ms, and until then etcd
// still attaches keys to them, so a grant on such a lease would be written
// and then deleted with it. The pool therefore keeps, for every idle lease,
// a lower bound of the moment etcd last reset it (this store's clock just
// before the grant or keep-alive was sent), and hands a lease out only
// while that bound plus its TTL is at least margin(TTL) ahead. These times
// keep Go's monotonic clock reading, so a step of the wall clock cannot
// make a lease look younger than it is.
type leasePool struct {
	mu       sync.Mutex
	max      int                     // idle leases kept in all; 0 turns the pool off
	n        int                     // idle leases held now
	inFlight int                     // grants for the pool sent and not yet answered
	idle     map[int64][]pooledLease // by granted TTL in whole seconds, newest last
	floors   map[int64]int64         // requested TTL -> TTL etcd granted, in seconds
}

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
	return &leasePool{max: max, idle: make(map[int64][]pooledLease), floors: make(map[int64]int64)}
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

// reserve reports whether a granter may grant one lease for the pool: the
// leases held and those being granted stay within max. A true answer must
// be followed by exactly one call of granted or ungranted.
func (p *leasePool) reserve() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.off() || p.n+p.inFlight >= p.max {
		return false
	}
	p.inFlight++
	return true
}

// ungranted ends a reservation whose grant failed.
func (p *leasePool) ungranted() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inFlight--
}

// granted ends a reservation: it pools lease id, of TTL ttl, granted by a
// request sent at at, if enough of its life is left at now. It reports
// whether the lease was pooled; if not, it carries no key and the caller
// revokes it or leaves it to expire.
func (p *leasePool) granted(id clientv3.LeaseID, ttl time.Duration, at, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
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
// ones it passes on the way. A lease it returns is never pooled again
// unless the acquire attached nothing to it (putUnused).
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
