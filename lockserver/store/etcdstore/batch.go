package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// Group grant (store.BatchStore, BatchRenewer). A batch of acquires is
// one etcd transaction, guarded by the token offset's version, whose
// operations are nested transactions, one per key, each creating its key
// on a lease of its own if absent: every member granted shares the
// transaction's revision, so the same token (tokens are unique per key, not
// across keys). A member whose lease has ended fails the whole transaction,
// and the batch falls back to single Acquires. A batch of releases is one
// transaction too, nesting each member's Release transaction (endGrants).
// Renewals read every key in one read-only transaction, then keep each
// grant's lease alive, all at once. See "Group grant" in
// docs/lock-service.md.

// defaultMaxTxnMembers is the most members of one transaction: under
// etcd's default --max-txn-ops of 128 with room to spare.
const defaultMaxTxnMembers = 64

var (
	_ store.BatchStore   = (*Store)(nil)
	_ store.BatchRenewer = (*Store)(nil)
)

// batchMember is one valid member of an AcquireMany transaction.
type batchMember struct {
	i      int // index in the request
	req    store.AcquireRequest
	secs   int64
	id     clientv3.LeaseID
	ttl    time.Duration // the lease's TTL as granted
	sentAt time.Time     // before the grant or keep-alive (monotonic)
	pooled bool
	ka     keptAlive // the keep-alive's answer, pooled members only
	kaDone chan struct{}
}

// keptAlive is the outcome of one keep-alive of an idle lease.
type keptAlive struct {
	resp *clientv3.LeaseKeepAliveResponse
	err  error
}

// AcquireMany implements store.BatchStore (see above). Answers are
// those of Acquire: ErrLockHeld for a held key, ErrBackendRestored for
// every member when the restore guard refuses, ErrUnavailable (wrapped)
// for every member of a transaction whose outcome is unknown, whose leases
// are then revoked so that no grant outlives the unknown.
func (s *Store) AcquireMany(ctx context.Context, reqs []store.AcquireRequest) []store.Result {
	out := make([]store.Result, len(reqs))
	keys := make([]string, len(reqs))
	for i, r := range reqs {
		keys[i] = r.Key
	}
	dups := store.ValidateBatchKeys(keys)
	var valid []int
	for i, r := range reqs {
		if out[i].Err = dups[i]; out[i].Err == nil {
			out[i].Err = store.ValidateAcquire(r.Key, r.Owner, r.TTL)
		}
		if out[i].Err == nil {
			valid = append(valid, i)
		}
	}
	if len(valid) == 0 {
		return out
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	failAll := func(err error) {
		for _, i := range valid {
			out[i].Err = err
		}
	}
	if err := ctx.Err(); err != nil {
		failAll(s.fail("acquire", "", "start", err))
		return out
	}
	if err := s.guardBefore(ctx); err != nil { // the restore guard: guard.go
		failAll(err)
		return out
	}
	for len(valid) > 0 {
		n := min(len(valid), s.maxTxnMembers)
		s.acquireTxn(ctx, reqs, valid[:n], out)
		valid = valid[n:]
	}
	return out
}

// acquireTxn grants the members idx of reqs in one transaction and writes
// their answers into out.
func (s *Store) acquireTxn(ctx context.Context, reqs []store.AcquireRequest, idx []int, out []store.Result) {
	var (
		ms    []*batchMember
		wg    sync.WaitGroup
		retry []int // members to serve with a single Acquire
	)
	for _, i := range idx {
		r := reqs[i]
		m := &batchMember{i: i, req: r, secs: int64((r.TTL + time.Second - 1) / time.Second)}
		if idle, ok := s.pool.take(m.secs, s.clock.Now()); ok {
			m.id, m.ttl, m.pooled = idle.id, idle.ttl, true
		}
		s.askAhead(m.secs)
		ms = append(ms, m)
	}
	// Leases for the members the pool could not serve, granted at once.
	var grantErr sync.Map // *batchMember -> error
	for _, m := range ms {
		if m.pooled {
			continue
		}
		wg.Go(func() {
			m.sentAt = s.clock.Now()
			g, err := s.cli.Grant(ctx, m.secs)
			if err != nil {
				grantErr.Store(m, err)
				return
			}
			s.granted.Add(1)
			s.pool.learnFloor(m.secs, g.TTL)
			m.id, m.ttl = g.ID, time.Duration(g.TTL)*time.Second
		})
	}
	wg.Wait()
	live := ms[:0:0]
	for _, m := range ms {
		if err, failed := grantErr.Load(m); failed {
			out[m.i].Err = s.fail("acquire", m.req.Key, "grant lease", err.(error))
			continue
		}
		live = append(live, m)
	}
	ms = live
	if len(ms) == 0 {
		return
	}
	// The keep-alives of pooled leases travel with the transaction.
	for _, m := range ms {
		if !m.pooled {
			continue
		}
		m.sentAt, m.kaDone = s.clock.Now(), make(chan struct{})
		go func() {
			defer close(m.kaDone)
			m.ka.resp, m.ka.err = s.cli.KeepAliveOnce(ctx, m.id)
		}()
	}
	resp, token, err := s.createMany(ctx, ms)
	for _, m := range ms {
		if m.kaDone != nil {
			<-m.kaDone
		}
	}
	if err == nil && resp != nil {
		err = s.guardAfter(ctx, resp) // once for the whole transaction
	}
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		// A lease of a member that would have been granted had ended:
		// etcd applied nothing. Serve every member alone.
		for _, m := range ms {
			s.giveBack(ctx, m, m.pooled && m.ka.err != nil)
			retry = append(retry, m.i)
		}
	case err != nil:
		// The outcome is unknown, or the guard refused: revoking every
		// lease ends whatever grant the transaction made.
		for _, m := range ms {
			s.revokeBestEffort(ctx, m.req.Key, m.id)
			if errors.Is(err, store.ErrBackendRestored) {
				out[m.i].Err = fmt.Errorf("etcdstore: acquire %q: %w", m.req.Key, err)
			} else {
				out[m.i].Err = s.fail("acquire", m.req.Key, fmt.Sprintf("create keys (a transaction of %d)", len(ms)), err)
			}
		}
	default:
		for j, m := range ms {
			nested := resp.Responses[j].GetResponseTxn()
			switch {
			case nested == nil:
				s.revokeBestEffort(ctx, m.req.Key, m.id)
				out[m.i].Err = fmt.Errorf("etcdstore: acquire %q: the transaction's answer has no member %d", m.req.Key, j)
			case !nested.Succeeded:
				s.giveBack(ctx, m, m.pooled && m.ka.err != nil)
				out[m.i].Err = heldBy(m.req.Key, (*clientv3.TxnResponse)(nested))
			case m.pooled && errors.Is(m.ka.err, rpctypes.ErrLeaseNotFound):
				// The lease ended after the key was attached to it: etcd
				// deleted the key with it. No grant exists.
				retry = append(retry, m.i)
			case m.pooled && m.ka.err != nil:
				s.revokeBestEffort(ctx, m.req.Key, m.id)
				out[m.i].Err = s.fail("acquire", m.req.Key, "reset an idle lease", m.ka.err)
			default:
				ttl := m.ttl
				if m.pooled {
					ttl = time.Duration(m.ka.resp.TTL) * time.Second
					s.fromPool.Add(1)
				}
				out[m.i].Lease = store.Lease{
					Key: m.req.Key, Owner: m.req.Owner, Token: token,
					LeaseID: leaseID(int64(m.id)), TTL: ttl, ExpiresAt: m.sentAt.Round(0).Add(ttl),
				}
			}
		}
	}
	for _, i := range retry {
		wg.Go(func() {
			r := reqs[i]
			out[i].Lease, out[i].Err = s.Acquire(ctx, r.Key, r.Owner, r.TTL)
		})
	}
	wg.Wait()
}

// createMany sends the group grant's transaction for members ms, with the
// current token offset, again while the offset changed under it, and
// returns the members' token.
func (s *Store) createMany(ctx context.Context, ms []*batchMember) (*clientv3.TxnResponse, int64, error) {
	ok := s.offsetKey()
	for range offsetTries {
		off, err := s.tokenOffset(ctx, "acquire")
		if err != nil {
			return nil, 0, err
		}
		ops := make([]clientv3.Op, len(ms))
		for j, m := range ms {
			k := s.prefix + m.req.Key
			ops[j] = clientv3.OpTxn(
				[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(k), "=", 0)},
				[]clientv3.Op{clientv3.OpPut(k, encodeRecord(m.req.Owner, m.ttl, off.x), clientv3.WithLease(m.id))},
				[]clientv3.Op{clientv3.OpGet(k)})
		}
		resp, err := s.cli.Txn(ctx).If(off.compares(ok)...).Then(ops...).Else(clientv3.OpGet(ok)).Commit()
		if err != nil {
			return nil, 0, err
		}
		if resp.Succeeded {
			return resp, resp.Header.Revision + off.x, nil
		}
		if err := s.learnOffset(resp.Responses[0]); err != nil {
			return nil, 0, err
		}
	}
	return nil, 0, fmt.Errorf("%w: etcdstore: group grant: the token offset changed under %d attempts in a row", store.ErrUnavailable, offsetTries)
}

// giveBack returns the lease of a member that carries no grant to the
// pool, or revokes it (dead: its keep-alive failed, or the pool is full).
func (s *Store) giveBack(ctx context.Context, m *batchMember, dead bool) {
	if dead || !s.pool.putUnused(m.id, m.ttl, m.sentAt, s.clock.Now()) {
		s.revokeBestEffort(ctx, m.req.Key, m.id)
	}
}

// readMany reads the lock keys of refs (members idx) in read-only
// transactions of at most maxTxnMembers keys: one linearizable read per
// transaction. It returns each member's key-value (nil when absent) and
// record, or the error of its transaction.
func (s *Store) readMany(ctx context.Context, op string, refs []store.LeaseRef, idx []int) (map[int]readKey, error) {
	got := make(map[int]readKey, len(idx))
	for len(idx) > 0 {
		n := min(len(idx), s.maxTxnMembers)
		ops := make([]clientv3.Op, n)
		for j, i := range idx[:n] {
			ops[j] = clientv3.OpGet(s.prefix + refs[i].Key)
		}
		resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, s.fail(op, "", fmt.Sprintf("read %d keys", n), err)
		}
		for j, i := range idx[:n] {
			kv, rec, err := s.lockKV(op, refs[i].Key, resp.Responses[j].GetResponseRange().GetKvs())
			got[i] = readKey{kv: kv, rec: rec, err: err}
		}
		idx = idx[n:]
	}
	return got, nil
}

type readKey struct {
	kv  *mvccpb.KeyValue
	rec record
	err error
}

// validRefs validates refs as Release and Renew do, and rejects repeated
// keys; it returns the indices of the valid members.
func validRefs(refs []store.LeaseRef, errs []error) []int {
	keys := make([]string, len(refs))
	for i, r := range refs {
		keys[i] = r.Key
	}
	dups := store.ValidateBatchKeys(keys)
	var valid []int
	for i, r := range refs {
		if errs[i] = dups[i]; errs[i] == nil {
			errs[i] = store.ValidateLease(r.Key, r.Owner, r.Token)
		}
		if errs[i] == nil {
			valid = append(valid, i)
		}
	}
	return valid
}

// ReleaseMany implements store.BatchStore: Release's transaction for
// every member at once, nested in one transaction per maxTxnMembers
// members (endGrants); each member is answered as Release answers.
func (s *Store) ReleaseMany(ctx context.Context, refs []store.LeaseRef) []error {
	out := make([]error, len(refs))
	valid := validRefs(refs, out)
	if len(valid) == 0 {
		return out
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	members := make([]store.LeaseRef, len(valid))
	for j, i := range valid {
		members[j] = refs[i]
	}
	for j, e := range s.endGrants(ctx, "release", members) {
		out[valid[j]] = e.err
	}
	return out
}

// RenewMany implements store.BatchRenewer: one read of every key,
// then one keep-alive per live grant's lease, all at once (see Renew for
// what each member is answered).
func (s *Store) RenewMany(ctx context.Context, refs []store.LeaseRef) []store.Result {
	errs := make([]error, len(refs))
	out := make([]store.Result, len(refs))
	valid := validRefs(refs, errs)
	for i, err := range errs {
		out[i].Err = err
	}
	if len(valid) == 0 {
		return out
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	got, err := s.readMany(ctx, "renew", refs, valid)
	if err != nil {
		for _, i := range valid {
			out[i].Err = err
		}
		return out
	}
	var wg sync.WaitGroup
	for _, i := range valid {
		r, g := refs[i], got[i]
		if out[i].Err = g.err; g.err != nil {
			continue
		}
		if out[i].Err = refusal(r.Key, g.kv, g.rec, r.Owner, r.Token); out[i].Err != nil {
			continue
		}
		wg.Go(func() { out[i].Lease, out[i].Err = s.keepAlive(ctx, r, g.kv) })
	}
	wg.Wait()
	return out
}
