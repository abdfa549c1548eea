package etcdstore

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// The restore guard. A stamp at Prefix + "_restore_guard" records the
// cluster ID tokens are issued on and the revision it was written at.
// A grant made on another cluster (etcdutl snapshot restore makes a new
// one) or at a revision not above the stamp's is withdrawn and refused with
// store.ErrBackendRestored. Only grants are checked: the other methods
// issue no token. A rollback that keeps the cluster ID is left to the token
// offset (offset.go). See "Restores" in docs/lock-service.md.

// guardName is the key, under Prefix, of the stamp.
const guardName = "_restore_guard"

// stamp is the value of the stamp key.
type stamp struct {
	// ClusterID is the etcd cluster ID in hex, as etcdctl prints it.
	ClusterID string `json:"clusterId"`
	// StampedAt is lock-server's clock when the stamp was written (UTC).
	StampedAt time.Time `json:"stampedAt"`
	// AdvancedPast is the N of the "lockctl advance" that wrote it (0 for
	// the first stamp of a cluster).
	AdvancedPast int64 `json:"advancedPast,omitempty"`
}

// guard is the Store's knowledge of the stamp.
type guard struct {
	mu       sync.Mutex
	cluster  uint64 // the stamp's cluster, 0 until known
	stampRev int64  // the stamp key's ModRevision
	mismatch bool   // a grant found another cluster: read the stamp again
}

func (s *Store) guardKey() string { return s.prefix + guardName }

// guardBefore makes sure the Store knows a stamp naming the cluster that
// answers, before Acquire writes anything. ErrBackendRestored when the
// stamp names another cluster.
func (s *Store) guardBefore(ctx context.Context) error {
	s.guard.mu.Lock()
	defer s.guard.mu.Unlock()
	if s.guard.cluster != 0 && !s.guard.mismatch {
		return nil
	}
	k := s.guardKey()
	for range offsetTries {
		answering, rev, st, err := s.readOrStamp(ctx, k)
		if err != nil {
			return err
		}
		if rev == 0 {
			continue // another writer changed the stamp meanwhile: read it again
		}
		if st.ClusterID != clusterHex(answering) {
			s.guard.mismatch = true
			return fmt.Errorf("%w: etcdstore: the etcd cluster answering is %s, but tokens were issued on cluster %s (stamped %s)",
				store.ErrBackendRestored, clusterHex(answering), st.ClusterID, st.StampedAt.Format(time.RFC3339))
		}
		s.guard.cluster, s.guard.stampRev, s.guard.mismatch = answering, rev, false
		return nil
	}
	return fmt.Errorf("%w: etcdstore: the restore guard's stamp changed under %d attempts to read it; try again", store.ErrUnavailable, offsetTries)
}

// readOrStamp reads the stamp at k, creating it first if there is none,
// and returns the answering cluster, the stamp and its revision. rev is 0
// when another writer changed the stamp between this read and the write
// that completes a placeholder (lock-servers stamping a fresh prefix at
// once): read it again.
func (s *Store) readOrStamp(ctx context.Context, k string) (answering uint64, rev int64, st stamp, err error) {
	first, err := json.Marshal(stamp{StampedAt: s.now().UTC()})
	if err != nil {
		return 0, 0, st, err
	}
	// Create the first stamp if there is none, with the answering cluster's
	// ID, which only the response header tells: written as a placeholder
	// here and completed just below in a transaction on its revision.
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(first))).
		Else(clientv3.OpGet(k)).
		Commit()
	if err != nil {
		return 0, 0, st, s.fail("acquire", "", "read the restore guard's stamp", err)
	}
	answering, rev = resp.Header.ClusterId, resp.Header.Revision
	if !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			return 0, 0, st, fmt.Errorf("etcdstore: the restore guard's stamp %q vanished while read", k)
		}
		if err := json.Unmarshal(kvs[0].Value, &st); err != nil {
			return 0, 0, st, fmt.Errorf("etcdstore: the restore guard's stamp %q is not a stamp: %w", k, err)
		}
		rev = kvs[0].ModRevision
	}
	if st.ClusterID != "" {
		return answering, rev, st, nil
	}
	// Just created, or a placeholder left by a crash or being completed by
	// another lock-server.
	st.ClusterID = clusterHex(answering)
	if st.StampedAt.IsZero() {
		st.StampedAt = s.now().UTC()
	}
	b, _ := json.Marshal(st) // a stamp always encodes
	put, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(k), "=", rev)).
		Then(clientv3.OpPut(k, string(b))).
		Commit()
	if err != nil {
		return 0, 0, st, s.fail("acquire", "", "write the restore guard's stamp", err)
	}
	if !put.Succeeded {
		return answering, 0, st, nil
	}
	s.log.Info("restore guard stamped", "event", EventRestoreGuardStamped, "clusterId", st.ClusterID, "revision", put.Header.Revision)
	return answering, put.Header.Revision, st, nil
}

// guardAfter checks the header of a grant's transaction against the stamp:
// ErrBackendRestored when the grant was made on another cluster or at a
// revision not above the stamp's. A refusal is checked once more after
// reading the stamp again, in case it was written since this store read it
// (lockctl advance). The caller revokes the lease of a refused grant, which
// deletes its key.
func (s *Store) guardAfter(ctx context.Context, resp *clientv3.TxnResponse) error {
	err := s.checkStamp(resp)
	if err != nil && s.guardBefore(ctx) == nil {
		err = s.checkStamp(resp)
	}
	return err
}

// checkStamp is guardAfter's check against the stamp this store knows.
func (s *Store) checkStamp(resp *clientv3.TxnResponse) error {
	s.guard.mu.Lock()
	defer s.guard.mu.Unlock()
	h := resp.Header
	if h.ClusterId == s.guard.cluster && h.Revision > s.guard.stampRev {
		return nil
	}
	s.guard.mismatch = true
	return fmt.Errorf("%w: etcdstore: the grant was made on cluster %s at revision %d; tokens are issued on cluster %s above revision %d",
		store.ErrBackendRestored, clusterHex(h.ClusterId), h.Revision, clusterHex(s.guard.cluster), s.guard.stampRev)
}

// Advance is the operator's step after a restore of etcd (lockctl
// advance). past must be at least the largest token ever issued before the
// restore (the maximum of lock-server's gauge
// lockserver_highest_token_issued, or of the tokens in lock_granted log
// lines and at the fence points). In one transaction it stamps the
// answering cluster and raises the token offset (offset.go), never
// lowering it, so that every later token is above past, whatever the
// cluster's revision: no --bump-revision is needed. ErrInvalidArgument
// unless 0 < past <= MaxAdvancePast; ErrUnavailable.
func (s *Store) Advance(ctx context.Context, past int64) (store.Advanced, error) {
	if past <= 0 || past > store.MaxAdvancePast {
		return store.Advanced{}, fmt.Errorf("%w: past is %d; want the largest token ever issued, 1..%d", store.ErrInvalidArgument, past, int64(store.MaxAdvancePast))
	}
	ctx, cancel := context.WithTimeout(ctx, s.reqTimeout)
	defer cancel()
	gk, ok := s.guardKey(), s.offsetKey()
	for range offsetTries {
		got, err := s.cli.Txn(ctx).Then(clientv3.OpGet(gk), clientv3.OpGet(ok)).Commit()
		if err != nil {
			return store.Advanced{}, s.fail("advance", "", "read the restore guard's stamp and the token offset", err)
		}
		out := store.Advanced{Past: past, Identity: "etcd cluster " + clusterHex(got.Header.ClusterId)}
		var prevRev int64
		if kvs := got.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
			var st stamp
			if json.Unmarshal(kvs[0].Value, &st) == nil && st.ClusterID != "" {
				out.Previous = "etcd cluster " + st.ClusterID
			}
			prevRev = kvs[0].ModRevision
		}
		off, err := s.parseOffset(got.Responses[1].GetResponseRange().GetKvs())
		if err != nil {
			return store.Advanced{}, err
		}
		// The raise lands at a revision above rev, and later grants above
		// that, so an offset of past - rev puts every later token above
		// past. Up to the clock as well, as a grant would raise it.
		rev := got.Header.Revision
		next := max(off.x, past-rev)
		if nowUs, err := s.nowMicros("advance"); err == nil {
			next = max(next, nowUs-rev)
		}
		st, _ := json.Marshal(stamp{ClusterID: clusterHex(got.Header.ClusterId), StampedAt: s.now().UTC(), AdvancedPast: past}) // a stamp always encodes
		raw, _ := json.Marshal(offsetRecord{Offset: next, RaisedAt: s.now().UTC(), AdvancedPast: past})                         // always encodes
		put, err := s.cli.Txn(ctx).
			If(append([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(gk), "=", prevRev)}, off.compares(ok)...)...).
			Then(clientv3.OpPut(gk, string(st)), clientv3.OpPut(ok, string(raw))).
			Commit()
		if err != nil {
			return store.Advanced{}, s.fail("advance", "", "write the restore guard's stamp and the token offset", err)
		}
		if !put.Succeeded {
			continue // a grant raised the offset meanwhile: read both again
		}
		out.NextAbove = put.Header.Revision + next
		s.guard.mu.Lock()
		s.guard.cluster, s.guard.stampRev, s.guard.mismatch = put.Header.ClusterId, put.Header.Revision, false
		s.guard.mu.Unlock()
		s.off.store(offsetVersion{rev: put.Header.Revision, x: next, raw: string(raw)})
		s.log.Info("restore guard advanced", "event", EventRestoreGuardAdvanced, "past", past, "clusterId", clusterHex(put.Header.ClusterId),
			"revision", put.Header.Revision, "tokenOffset", next)
		return out, nil
	}
	return store.Advanced{}, fmt.Errorf("%w: etcdstore: the restore guard's stamp or the token offset changed under %d attempts at advance; run it again", store.ErrUnavailable, offsetTries)
}

// clusterHex formats an etcd cluster ID as etcdctl prints it.
func clusterHex(id uint64) string { return strconv.FormatUint(id, 16) }
