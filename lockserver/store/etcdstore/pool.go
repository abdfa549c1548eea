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
// from its key: after a Release deleted the key, or after an Acquire lost
// its transaction and attached nothing.
//
// Nothing here is needed for safety: a lease taken from the pool is
// confirmed alive by the keep-alive before any key is attached to it, and
// a lease left in the pool simply expires after its TTL. The pool only
// forgets leases it knows have expired, so that no acquire wastes a
// keep-alive on them.
type leasePool struct {
	mu   sync.Mutex
	max  int                     // idle leases kept in all; 0 disables the pool
	n    int                     // idle leases held now
	idle map[int64][]pooledLease // by requested TTL in whole seconds, newest last
}

// pooledLease is one idle lease. expires is when the pool gives up on it:
// the moment it entered the pool plus its TTL. The lease was last reset at
// or before that moment, so unless something resets it later (a leader
// change, or a renewal racing the release) etcd has expired it by then.
// The pool may keep a dead lease until then (the keep-alive at take finds
// out) and forgets it afterwards, alive or not: a forgotten lease carries
// no key and expires on its own.
type pooledLease struct {
	id      clientv3.LeaseID
	ttl     time.Duration // granted by etcd
	expires time.Time     // the pool forgets the lease from then on
}

func newLeasePool(max int) *leasePool {
	return &leasePool{max: max, idle: make(map[int64][]pooledLease)}
}

// take returns the most recently pooled lease for secs that has not surely
// expired at now, and forgets every lease of secs that has.
func (p *leasePool) take(secs int64, now time.Time) (pooledLease, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
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

// put adds an idle lease for secs, last reset at or before at. It reports false, and keeps nothing, when the pool is full;
// the caller then leaves the lease to expire.
func (p *leasePool) put(secs int64, id clientv3.LeaseID, ttl time.Duration, at time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n >= p.max {
		p.forgetExpired(at)
	}
	if p.n >= p.max {
		return false
	}
	p.idle[secs] = append(p.idle[secs], pooledLease{id: id, ttl: ttl, expires: at.Add(ttl)})
	p.n++
	return true
}

// forgetExpired drops every lease whose expires is not after now. p.mu is
// held.
func (p *leasePool) forgetExpired(now time.Time) {
	for secs, list := range p.idle {
		kept := list[:0]
		for _, l := range list {
			if now.Before(l.expires) {
				kept = append(kept, l)
			}
		}
		p.n -= len(list) - len(kept)
		if len(kept) == 0 {
			delete(p.idle, secs)
		} else {
			p.idle[secs] = kept
		}
	}
}

// len returns the number of idle leases held.
func (p *leasePool) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}
