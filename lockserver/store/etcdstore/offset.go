package etcdstore

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// The token offset. A token is the granting transaction's revision plus
// the offset at Prefix + "_token_offset". Every grant compares the offset
// key's version and writes the offset X it used into its record, so
// token = ModRevision + X while the grant lives; the offset is only ever
// raised, by a compare-and-swap that fails any grant racing it, so tokens
// increase in revision order. A grant is sent only when the offset key's
// revision plus X is within a second of the clock in microseconds;
// otherwise the offset is first raised to the clock. So the first grant
// after a rollback that keeps the cluster ID lands above every earlier
// token (docs/adr/0002-token-floor-from-lockdbs-clock.md). A clock past
// store.MaxAdvancePast is refused with ErrUnavailable.

// offsetName is the key, under Prefix, of the token offset.
const offsetName = "_token_offset"

// maxBehind is how far, in microseconds, a token may lag lock-server's
// clock before the offset is raised: one second.
const maxBehind = 1_000_000

// offsetTries bounds the attempts of one grant, or one raise, whose
// compare on the offset keeps failing because the offset keeps changing.
const offsetTries = 8

// offsetRecord is the value of the offset key.
type offsetRecord struct {
	// Offset is added to a grant's revision to make its token.
	Offset int64 `json:"offset"`
	// RaisedAt is lock-server's clock when it was written (UTC).
	RaisedAt time.Time `json:"raisedAt"`
	// AdvancedPast is the N of the "lockctl advance" that wrote it, 0
	// for a catch-up to the clock.
	AdvancedPast int64 `json:"advancedPast,omitempty"`
}

// offsetVersion is one version of the offset key as the store read or
// wrote it.
type offsetVersion struct {
	rev int64  // the key's ModRevision; 0 while it does not exist
	x   int64  // the offset, 0 while the key does not exist
	raw string // the key's value, compared byte for byte
}

// compares holds in a transaction exactly when the offset key is still
// this version (absent when rev is 0).
func (v offsetVersion) compares(k string) []clientv3.Cmp {
	if v.rev == 0 {
		return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(k), "=", 0)}
	}
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(k), "=", v.rev),
		clientv3.Compare(clientv3.Value(k), "=", v.raw),
	}
}

// fresh reports whether a grant made while v is in effect gets a token
// no more than maxBehind behind nowUs: its revision is above v.rev.
func (v offsetVersion) fresh(nowUs int64) bool { return v.rev+v.x >= nowUs-maxBehind }

// offsetsKept is how many versions of the offset key a Store remembers
// to guess the offset of a grant it did not make or made before a raise
// (grantedWith).
const offsetsKept = 16

// offsets is the Store's knowledge of the offset key.
type offsets struct {
	mu      sync.Mutex
	cur     offsetVersion
	known   []offsetVersion // the last offsetsKept versions stored, oldest first
	raising sync.Mutex      // one raise at a time per Store
}

func (o *offsets) load() offsetVersion {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.cur
}

func (o *offsets) store(v offsetVersion) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.cur = v
	if !slices.Contains(o.known, v) {
		o.known = append(o.known[max(0, len(o.known)+1-offsetsKept):], v)
	}
}

// grantedWith guesses the offset version the grant with token was made
// under: the last one stored below which the grant's revision lies (a
// grant's revision is above its version's), else the oldest known. A
// wrong guess costs a transaction, never a wrong answer: the caller's
// compares check it.
func (o *offsets) grantedWith(token int64) offsetVersion {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := len(o.known) - 1; i >= 0; i-- {
		if v := o.known[i]; v.rev+v.x < token {
			return v
		}
	}
	if len(o.known) > 0 {
		return o.known[0]
	}
	return o.cur
}

func (s *Store) offsetKey() string { return s.prefix + offsetName }

// parseOffset reads the offset key from kvs (none: the key is absent,
// offset 0).
func (s *Store) parseOffset(kvs []*mvccpb.KeyValue) (offsetVersion, error) {
	if len(kvs) == 0 {
		return offsetVersion{}, nil
	}
	var rec offsetRecord
	if err := json.Unmarshal(kvs[0].Value, &rec); err != nil || rec.Offset < 0 {
		return offsetVersion{}, fmt.Errorf("etcdstore: the token offset %q is not an offset (%q): %v", s.offsetKey(), kvs[0].Value, err)
	}
	return offsetVersion{rev: kvs[0].ModRevision, x: rec.Offset, raw: string(kvs[0].Value)}, nil
}

// learnOffset records the offset key as a granting transaction's Else
// branch read it (op: its response), so that the next attempt compares
// with it.
func (s *Store) learnOffset(op *etcdserverpb.ResponseOp) error {
	v, err := s.parseOffset(op.GetResponseRange().GetKvs())
	if err != nil {
		return err
	}
	s.off.store(v)
	return nil
}

// nowMicros is lock-server's clock in microseconds since 1970, or
// ErrUnavailable when it reads past the largest token.
func (s *Store) nowMicros(op string) (int64, error) {
	now := s.now()
	us := now.UnixMicro()
	if us > store.MaxAdvancePast {
		return 0, fmt.Errorf("%w: etcdstore: %s: lock-server's clock reads %s, past the largest token (2^53 - 1 microseconds after 1970): fix the clock",
			store.ErrUnavailable, op, now.UTC().Format(time.RFC3339))
	}
	return us, nil
}

// tokenOffset returns the offset version a grant compares with and adds
// to its revision: the one the store knows if it is fresh by the clock
// now, else one raised to the clock (raise).
func (s *Store) tokenOffset(ctx context.Context, op string) (offsetVersion, error) {
	nowUs, err := s.nowMicros(op)
	if err != nil {
		return offsetVersion{}, err
	}
	if v := s.off.load(); v.fresh(nowUs) {
		return v, nil
	}
	return s.raise(ctx, op, nowUs)
}

// raise reads the offset key and, unless another lock-server has raised
// it enough already, raises it to nowUs minus the revision read, never
// lowering it, with a compare-and-swap on the version read.
func (s *Store) raise(ctx context.Context, op string, nowUs int64) (offsetVersion, error) {
	s.off.raising.Lock()
	defer s.off.raising.Unlock()
	if v := s.off.load(); v.fresh(nowUs) { // raised while this call waited
		return v, nil
	}
	k := s.offsetKey()
	got, err := s.cli.Get(ctx, k)
	if err != nil {
		return offsetVersion{}, s.fail(op, "", "read the token offset", err)
	}
	v, err := s.parseOffset(got.Kvs)
	if err != nil {
		return offsetVersion{}, err
	}
	rev := got.Header.Revision
	for range offsetTries {
		s.off.store(v)
		if v.fresh(nowUs) {
			return v, nil
		}
		next := max(v.x, nowUs-rev)
		b, _ := json.Marshal(offsetRecord{Offset: next, RaisedAt: s.now().UTC()}) // always encodes
		resp, err := s.cli.Txn(ctx).
			If(v.compares(k)...).
			Then(clientv3.OpPut(k, string(b))).
			Else(clientv3.OpGet(k)).
			Commit()
		if err != nil {
			return offsetVersion{}, s.fail(op, "", "raise the token offset", err)
		}
		if resp.Succeeded {
			raised := offsetVersion{rev: resp.Header.Revision, x: next, raw: string(b)}
			s.off.store(raised)
			s.log.Debug("token offset raised to the clock", "offset", next, "revision", raised.rev, "previous", v.x)
			return raised, nil
		}
		// Another lock-server wrote it first: compare with its version.
		if v, err = s.parseOffset(resp.Responses[0].GetResponseRange().GetKvs()); err != nil {
			return offsetVersion{}, err
		}
		rev = resp.Header.Revision
	}
	return offsetVersion{}, fmt.Errorf("%w: etcdstore: %s: the token offset changed under %d raises in a row", store.ErrUnavailable, op, offsetTries)
}
