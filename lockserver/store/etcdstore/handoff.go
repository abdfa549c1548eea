package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// Handoff. One transaction replaces the live grant (from) by the next
// one (to), with G a guess of the offset from was granted with and X the
// current offset:
//
//	If(grantIs(from, G): ModRevision(Prefix+k) == from.Token - G,
//	   ownerRange(from.Owner, G) around Value(Prefix+k);
//	   the offset key is still the version whose offset is X)
//	Then(Put(Prefix+k, record(to, X), WithLease(new lease), WithPrevKV()))
//	Else(Get(Prefix+k), Get(offset key))
//
// The compares are Release's token and owner checks, as Release makes
// them (endGrants); a wrong guess of G, or a changed offset, sends it
// again. The new lease
// has never carried a key; the old one is left empty and revoked in the
// background. See "Handoff" in docs/lock-service.md.

var _ store.Handoffer = (*Store)(nil)

// ownerRange returns the bounds between which, exclusive, the value of a
// lock key held by owner and granted with offset lies, and no other key's
// value.
func ownerRange(owner string, offset int64) (lo, hi string) {
	full := encodeRecord(owner, 0, offset) // {"owner":O,"offset":G,"ttlMs":0}
	lo = full[:len(full)-2]                // {"owner":O,"offset":G,"ttlMs":
	return lo, lo[:len(lo)-1] + ";"
}

// Handoff implements store.Handoffer in one transaction (above),
// after the restore guard's check as Acquire makes it. ErrStaleToken,
// ErrNotHeld (from is not the live grant: nothing changed),
// ErrInvalidArgument, ErrBackendRestored (no grant to to.Owner exists;
// from is untouched, except when the grant's transaction is refused only
// after it applied, the cluster having changed under it: then the new
// lease is revoked, which deletes the key, and from has ended too, as a
// Release followed by a refused Acquire), ErrUnavailable (outcome
// unknown; the new lease is revoked best effort, which ends the new grant
// if it was made, and from with it).
func (s *Store) Handoff(ctx context.Context, from store.LeaseRef, to store.AcquireRequest) (store.Lease, error) {
	if err := store.ValidateHandoff(from, to); err != nil {
		return store.Lease{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	if err := ctx.Err(); err != nil {
		return store.Lease{}, s.fail("handoff", from.Key, "start", err)
	}
	if err := s.guardBefore(ctx); err != nil {
		return store.Lease{}, err
	}
	secs := int64((to.TTL + time.Second - 1) / time.Second)
	idle, ok := s.pool.take(secs, s.clock.Now())
	s.askAhead(secs)
	if ok {
		if l, done, err := s.handoffOnIdle(ctx, from, to, idle); done {
			return l, err
		}
	}
	sentAt := s.clock.Now()
	g, err := s.cli.Grant(ctx, secs)
	if err != nil {
		return store.Lease{}, s.fail("handoff", from.Key, "grant lease", err)
	}
	s.granted.Add(1)
	granted := time.Duration(g.TTL) * time.Second
	s.pool.learnFloor(secs, g.TTL)
	resp, token, err := s.replace(ctx, from, to.Owner, g.ID, granted)
	if err != nil {
		s.revokeBestEffort(ctx, from.Key, g.ID)
		return store.Lease{}, s.fail("handoff", from.Key, "replace key", err)
	}
	if !resp.Succeeded {
		if !s.pool.putUnused(g.ID, granted, sentAt, s.clock.Now()) {
			s.revokeBestEffort(ctx, from.Key, g.ID)
		}
		return store.Lease{}, s.handoffRefusal(from, resp)
	}
	s.revokeOld(from.Key, resp)
	return store.Lease{
		Key: to.Key, Owner: to.Owner, Token: token,
		LeaseID: leaseID(int64(g.ID)), TTL: granted, ExpiresAt: sentAt.Round(0).Add(granted),
	}, nil
}

// handoffOnIdle is Handoff on an idle lease, as acquireOnIdle is Acquire
// on one. done is false when the idle lease had ended before the
// transaction, which then changed nothing: Handoff goes on with a new
// lease.
func (s *Store) handoffOnIdle(ctx context.Context, from store.LeaseRef, to store.AcquireRequest, idle pooledLease) (l store.Lease, done bool, err error) {
	sentAt := s.clock.Now()
	kac := s.keepAliveBeside(ctx, idle.id)
	resp, token, err := s.replace(ctx, from, to.Owner, idle.id, idle.ttl)
	ka := <-kac
	switch {
	case err == nil && !resp.Succeeded:
		if ka.err == nil {
			s.pool.putUnused(idle.id, idle.ttl, sentAt, s.clock.Now())
		}
		return store.Lease{}, true, s.handoffRefusal(from, resp)
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		// etcd refused the transaction: the idle lease had ended, and
		// nothing changed.
		return store.Lease{}, false, nil
	case ka.err != nil || err != nil:
		// The transaction may have applied, and the idle lease may have
		// ended since (taking the key with it). Either way the outcome is
		// unknown; revoking the lease ends any grant made on it.
		s.revokeBestEffort(ctx, from.Key, idle.id)
		if err != nil {
			return store.Lease{}, true, s.fail("handoff", from.Key, "replace key", err)
		}
		return store.Lease{}, true, s.fail("handoff", from.Key, "reset an idle lease",
			fmt.Errorf("%w (the key may have been handed off and ended with the lease)", ka.err))
	}
	s.fromPool.Add(1)
	s.revokeOld(from.Key, resp)
	ttl := time.Duration(ka.resp.TTL) * time.Second
	return store.Lease{
		Key: to.Key, Owner: to.Owner, Token: token,
		LeaseID: leaseID(int64(idle.id)), TTL: ttl, ExpiresAt: sentAt.Round(0).Add(ttl),
	}, true, nil
}

// replace runs Handoff's transaction: put the key with lease id and a
// record of owner, ttl and the current token offset if from is its live
// grant, else read it (and the offset, which the next attempt compares
// with). It returns the new grant's token when resp.Succeeded. A grant
// made where the restore guard does not allow it is an error wrapping
// store.ErrBackendRestored (the caller revokes lease id).
func (s *Store) replace(ctx context.Context, from store.LeaseRef, owner string, id clientv3.LeaseID, ttl time.Duration) (resp *clientv3.TxnResponse, token int64, err error) {
	k, ok := s.prefix+from.Key, s.offsetKey()
	guess := int64(-1) // from's offset: first the one the store guesses
	for range offsetTries {
		off, err := s.tokenOffset(ctx, "handoff")
		if err != nil {
			return nil, 0, err
		}
		if guess < 0 {
			guess = s.off.grantedWith(from.Token).x
		}
		resp, err = s.cli.Txn(ctx).
			If(append(s.grantIs(from, offsetVersion{x: guess}), off.compares(ok)...)...).
			Then(clientv3.OpPut(k, encodeRecord(owner, ttl, off.x), clientv3.WithLease(id), clientv3.WithPrevKV())).
			Else(clientv3.OpGet(k), clientv3.OpGet(ok)).
			Commit()
		if err != nil {
			return resp, 0, err
		}
		if resp.Succeeded {
			return resp, resp.Header.Revision + off.x, s.guardAfter(ctx, resp)
		}
		if err := s.learnOffset(resp.Responses[1]); err != nil {
			return nil, 0, err
		}
		if _, guess, err = s.judge("handoff", from, resp); err != nil {
			return resp, 0, nil // from is not the live grant: handoffRefusal says why
		}
		// from is live, granted with offset guess: again with it and the offset read.
	}
	return nil, 0, fmt.Errorf("%w: etcdstore: handoff %q: the key or the token offset changed under %d attempts in a row", store.ErrUnavailable, from.Key, offsetTries)
}

// handoffRefusal is Release's answer for a Handoff transaction that did
// not apply, from the key as the transaction read it.
func (s *Store) handoffRefusal(from store.LeaseRef, resp *clientv3.TxnResponse) error {
	if _, _, err := s.judge("handoff", from, resp); err != nil {
		return err
	}
	// Unreachable: the key matched every compare when read.
	return fmt.Errorf("%w: the lease on key %q with token %d was not the live grant when handed off", store.ErrNotHeld, from.Key, from.Token)
}

// revokeOld revokes, in the background, the lease the key was attached to
// before a Handoff's transaction moved it (resp's previous key): it now
// carries nothing.
func (s *Store) revokeOld(key string, resp *clientv3.TxnResponse) {
	put := resp.Responses[0].GetResponsePut()
	if put == nil || put.PrevKv == nil || put.PrevKv.Lease == 0 {
		return
	}
	s.revokeLater(key, clientv3.LeaseID(put.PrevKv.Lease))
}

// revokeLater revokes lease id, which carries no key any more, from a
// goroutine of its own, at once and best effort (failing, the lease
// expires after its TTL). Close waits for these goroutines; none starts
// once Close has. Revocations are not batched: a batch stalls the
// transactions queued behind it (docs/benchmarks.md).
func (s *Store) revokeLater(key string, id clientv3.LeaseID) {
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	if s.closing {
		return
	}
	s.bg.Go(func() {
		if s.revokeBestEffort(context.Background(), key, id) {
			s.revoked.Add(1)
		}
	})
}
