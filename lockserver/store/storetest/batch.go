package storetest

import (
	"errors"
	"fmt"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// batchStore returns the BatchStore under s (beneath a wrapper with
// Unwrap, such as lock-server's Batcher), or skips.
func batchStore(t *testing.T, s store.LockStore) store.BatchStore {
	t.Helper()
	if b, ok := s.(interface{ Unwrap() store.LockStore }); ok {
		s = b.Unwrap()
	}
	bs, ok := s.(store.BatchStore)
	if !ok {
		t.Skipf("%T is not a store.BatchStore", s)
	}
	return bs
}

// testBatchAnswersEachMember: one AcquireMany in which some keys are free
// (granted, each with a token above its key's earlier grants) and some are
// held (refused alone); one ReleaseMany in which one member is the live
// grant, one a stale token, one another owner and one a key never granted,
// each answered as Release would answer it; the same for RenewMany when
// the store has it; and a key repeated in one call.
func testBatchAnswersEachMember(t *testing.T, b Backend) {
	s := open(t, b)
	bs := batchStore(t, s)
	held := mustAcquire(t, s, "held", "worker-h", longTTL)
	old := mustAcquire(t, s, "regranted", "worker-o", longTTL)
	if err := s.Release(ctxT(t), "regranted", "worker-o", old.Token); err != nil {
		t.Fatalf("Release: %v", err)
	}
	res := bs.AcquireMany(ctxT(t), []store.AcquireRequest{
		{Key: "fresh-1", Owner: "worker-a", TTL: longTTL},
		{Key: "held", Owner: "worker-a", TTL: longTTL},
		{Key: "regranted", Owner: "worker-b", TTL: longTTL},
		{Key: "fresh-2", Owner: "worker-c", TTL: longTTL},
		{Key: "bad key", Owner: "worker-c", TTL: longTTL},
	})
	if len(res) != 5 {
		t.Fatalf("AcquireMany answered %d members; want 5", len(res))
	}
	for i, want := range []struct{ key, owner string }{{"fresh-1", "worker-a"}, {}, {"regranted", "worker-b"}, {"fresh-2", "worker-c"}} {
		if want.key == "" {
			continue
		}
		r := res[i]
		if r.Err != nil || r.Lease.Key != want.key || r.Lease.Owner != want.owner || r.Lease.Token <= 0 || r.Lease.TTL < longTTL || r.Lease.LeaseID == "" {
			t.Fatalf("member %d (%s): %+v, %v; want granted to %s", i, want.key, r.Lease, r.Err, want.owner)
		}
		wantHeldBy(t, s, want.key, r.Lease)
	}
	wantErr(t, "member held", res[1].Err, store.ErrLockHeld)
	wantErr(t, "member with a bad key", res[4].Err, store.ErrInvalidArgument)
	wantHeldBy(t, s, "held", held)
	if res[2].Lease.Token <= old.Token {
		t.Fatalf("batched grant of a released key has token %d; want > its earlier token %d", res[2].Lease.Token, old.Token)
	}
	if res[0].Lease.Token <= held.Token || res[3].Lease.Token <= held.Token {
		t.Fatalf("batched grants have tokens %d and %d, not above %d granted before the batch", res[0].Lease.Token, res[3].Lease.Token, held.Token)
	}
	// The held key is refused as a whole batch again, and a key repeated in
	// one call is refused as invalid after its first occurrence.
	res = bs.AcquireMany(ctxT(t), []store.AcquireRequest{
		{Key: "fresh-3", Owner: "worker-d", TTL: longTTL},
		{Key: "fresh-3", Owner: "worker-e", TTL: longTTL},
	})
	if res[0].Err != nil || res[0].Lease.Owner != "worker-d" {
		t.Fatalf("first of a repeated key: %+v, %v; want granted to worker-d", res[0].Lease, res[0].Err)
	}
	wantErr(t, "second of a repeated key", res[1].Err, store.ErrInvalidArgument)
	wantHeldBy(t, s, "fresh-3", res[0].Lease)

	if br, ok := bs.(store.BatchRenewer); ok {
		rr := br.RenewMany(ctxT(t), []store.LeaseRef{
			{Key: "fresh-1", Owner: "worker-a", Token: liveToken(t, s, "fresh-1")},
			{Key: "regranted", Owner: "worker-o", Token: old.Token},
			{Key: "held", Owner: "mallory", Token: held.Token},
			{Key: "never", Owner: "worker-a", Token: 1},
		})
		if rr[0].Err != nil || rr[0].Lease.Owner != "worker-a" || rr[0].Lease.Key != "fresh-1" || rr[0].Lease.TTL < longTTL {
			t.Fatalf("renew of the live grant: %+v, %v; want renewed", rr[0].Lease, rr[0].Err)
		}
		wantErr(t, "renew with a stale token", rr[1].Err, store.ErrStaleToken)
		wantErr(t, "renew by another owner", rr[2].Err, store.ErrNotHeld)
		wantErr(t, "renew of a key never granted", rr[3].Err, store.ErrNotHeld)
	}

	fresh2 := inspect(t, s, "fresh-2").Lease
	errs := bs.ReleaseMany(ctxT(t), []store.LeaseRef{
		{Key: "fresh-2", Owner: "worker-c", Token: fresh2.Token},
		{Key: "regranted", Owner: "worker-o", Token: old.Token},
		{Key: "held", Owner: "mallory", Token: held.Token},
		{Key: "never", Owner: "worker-a", Token: 1},
		{Key: "held", Owner: "worker-h", Token: 0},
	})
	if len(errs) != 5 {
		t.Fatalf("ReleaseMany answered %d members; want 5", len(errs))
	}
	if errs[0] != nil {
		t.Fatalf("release of the live grant: %v", errs[0])
	}
	wantFree(t, s, "fresh-2")
	wantErr(t, "release with a stale token", errs[1], store.ErrStaleToken)
	wantErr(t, "release by another owner", errs[2], store.ErrNotHeld)
	wantErr(t, "release of a key never granted", errs[3], store.ErrNotHeld)
	wantErr(t, "release with token 0", errs[4], store.ErrInvalidArgument)
	wantHeldBy(t, s, "held", held)
	wantHeldBy(t, s, "regranted", liveLease(t, s, "regranted"))
}

func liveToken(t *testing.T, s store.LockStore, key string) int64 {
	t.Helper()
	return liveLease(t, s, key).Token
}

// liveLease is the live lease of key, which the test expects.
func liveLease(t *testing.T, s store.LockStore, key string) store.Lease {
	t.Helper()
	st := inspect(t, s, key)
	if st.Lease == nil {
		t.Fatalf("Inspect(%q): no live lease; want one", key)
	}
	return *st.Lease
}

// CheckBatchFailureAnswersEveryMember calls AcquireMany on bs for free
// keys and one key, poison, that the caller has arranged to make the
// backend's batch call fail, and checks that every member is answered with
// an error, none with a grant, and that no key was granted (inspected
// through s). Stores' own tests call it with their fault.
func CheckBatchFailureAnswersEveryMember(t *testing.T, s store.LockStore, bs store.BatchStore, poison string) {
	t.Helper()
	reqs := []store.AcquireRequest{
		{Key: "free-1", Owner: "worker-a", TTL: longTTL},
		{Key: poison, Owner: "worker-b", TTL: longTTL},
		{Key: "free-2", Owner: "worker-c", TTL: longTTL},
	}
	res := bs.AcquireMany(ctxT(t), reqs)
	if len(res) != len(reqs) {
		t.Fatalf("AcquireMany answered %d members; want %d", len(res), len(reqs))
	}
	var failures []string
	for i, r := range res {
		if r.Err == nil || errors.Is(r.Err, store.ErrLockHeld) {
			failures = append(failures, fmt.Sprintf("member %d (%s): %+v, %v; want the batch's error", i, reqs[i].Key, r.Lease, r.Err))
		}
	}
	for _, r := range reqs {
		if st := inspect(t, s, r.Key); st.Lease != nil {
			failures = append(failures, fmt.Sprintf("key %s is held by %+v after a failed batch", r.Key, *st.Lease))
		}
	}
	for _, f := range failures {
		t.Error(f)
	}
}
