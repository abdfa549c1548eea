package etcdstore

import (
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// TestOneOfARacingReleaseRevokeAndHandoffEndsTheGrant: two lock-servers
// end one grant at once, by a handoff and one to three of a release, a
// batch of one release and a force-revoke naming its token, in a seeded
// order, while
// the token offset is raised between the grant and its end by either
// (each then guesses the grant's offset differently). Exactly one ends
// it; the others are refused with ErrStaleToken when the handoff won (a
// newer grant is live), else ErrNotHeld, and nothing else is touched.
func TestOneOfARacingReleaseRevokeAndHandoffEndsTheGrant(t *testing.T) {
	const seed = 20261206
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	clkA, clkB := &fakeClock{now: t0}, &fakeClock{now: t0}
	// Leases granted ahead, so that a handoff, like the others, is one
	// transaction and can win the race.
	a := openCfgT(t, func(cfg *Config) { cfg.Clock = clkA })
	b := openCfgT(t, func(cfg *Config) { cfg.Clock, cfg.Prefix = clkB, a.prefix })
	for _, s := range []*Store{a, b} { // each asks for leases of 10 s ahead
		w := mustAcquire(t, s, "payout:warm-up", "worker-a", 10*time.Second)
		if err := s.Release(ctxT(t), w.Key, w.Owner, w.Token); err != nil {
			t.Fatal(err)
		}
	}
	const key = "payout:acct-race"
	names := []string{"release", "release of one", "revoke naming the token", "handoff"}
	for round := range 48 {
		g := mustAcquire(t, a, key, "worker-a", 10*time.Second)
		switch round % 3 { // raise the offset after the grant, through a or b
		case 1:
			clkA.advance(2 * time.Second)
			grantRelease(t, a, "payout:raise", 1)
		case 2:
			clkB.advance(2 * time.Second)
			grantRelease(t, b, "payout:raise", 1)
		}
		ref := store.LeaseRef{Key: key, Owner: g.Owner, Token: g.Token}
		hander := []*Store{a, b}[round%2]
		awaitIdle(t, hander)
		var handed store.Lease
		var revoked store.Lease
		ops := []func() error{
			func() error { return a.Release(ctxT(t), key, g.Owner, g.Token) },
			func() error { return b.ReleaseMany(ctxT(t), []store.LeaseRef{ref})[0] },
			func() error { l, err := b.Revoke(ctxT(t), key, g.Token); revoked = l; return err },
			func() error {
				l, err := hander.Handoff(ctxT(t), ref, store.AcquireRequest{Key: key, Owner: "worker-b", TTL: 10 * time.Second})
				handed = l
				return err
			},
		}
		// The handoff, the slowest to start, and one to three others.
		racing := append([]int{3}, rng.Perm(3)[:1+rng.IntN(3)]...)
		rng.Shuffle(len(racing), func(i, j int) { racing[i], racing[j] = racing[j], racing[i] })
		errs := make([]error, len(ops))
		for i := range errs {
			errs[i] = errNotRun
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for _, i := range racing {
			wg.Go(func() { <-start; errs[i] = ops[i]() })
		}
		close(start)
		wg.Wait()

		won := -1
		for i, err := range errs {
			if err == nil {
				if won >= 0 {
					t.Fatalf("round %d: both %s and %s ended grant %d", round, names[won], names[i], g.Token)
				}
				won = i
			}
		}
		if won < 0 {
			t.Fatalf("round %d: nobody ended grant %d: %v", round, g.Token, errs)
		}
		refusal := store.ErrNotHeld
		if won == 3 {
			refusal = store.ErrStaleToken
		}
		for i, err := range errs {
			if i != won && err != errNotRun && !errors.Is(err, refusal) {
				t.Errorf("round %d: %s lost to %s with %v; want %v", round, names[i], names[won], err, refusal)
			}
		}
		if won == 2 && (revoked.Token != g.Token || revoked.Owner != g.Owner || revoked.LeaseID != g.LeaseID) {
			t.Errorf("round %d: the revoke answered %+v; want grant %d of %s on lease %s", round, revoked, g.Token, g.Owner, g.LeaseID)
		}
		st, err := a.Inspect(ctxT(t), key)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case won == 3 && (st.Lease == nil || st.Lease.Token != handed.Token || handed.Token <= g.Token || st.Lease.Owner != "worker-b"):
			t.Fatalf("round %d: after the handoff to %+v won: %+v; want that grant live, above %d", round, handed, st.Lease, g.Token)
		case won != 3 && st.Lease != nil:
			t.Fatalf("round %d: after the %s won: %+v live; want the key free", round, names[won], st.Lease)
		}
		if won == 3 {
			if err := b.Release(ctxT(t), key, handed.Owner, handed.Token); err != nil {
				t.Fatalf("round %d: release of the handed grant: %v", round, err)
			}
		}
	}
}

// errNotRun marks an operation left out of a round of the race.
var errNotRun = errors.New("not run")

// TestReleaseManyAnswersEachMemberAsReleaseDoes: one batch of releases,
// split over transactions, mixing the live grant (made before and after
// the offset was raised), another owner's, a previous grant's token, a
// token above the live one, a free key and a repeated key. Each member
// is answered as a Release of it alone would be, and only the grants
// named are ended.
func TestReleaseManyAnswersEachMemberAsReleaseDoes(t *testing.T) {
	clk := &fakeClock{now: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)}
	s := openCfgT(t, func(cfg *Config) { cfg.Clock, cfg.IdleLeases = clk, 0 })
	s.maxTxnMembers = 3
	ttl := 10 * time.Second
	maxOwner := strings.Repeat("w", api.MaxOwnerLen)
	before := mustAcquire(t, s, "payout:acct-before", "worker-a", ttl)
	clk.advance(2 * time.Second)
	live := mustAcquire(t, s, "payout:acct-live", maxOwner, ttl)
	if offsetT(t, s) == 0 || live.Token-before.Token < 1_000_000 {
		t.Fatalf("the offset was not raised between the grants (%d then %d)", before.Token, live.Token)
	}
	other := mustAcquire(t, s, "payout:acct-other", maxOwner[:api.MaxOwnerLen-1], ttl)
	old := mustAcquire(t, s, "payout:acct-regranted", "worker-a", ttl)
	if err := s.Release(ctxT(t), old.Key, old.Owner, old.Token); err != nil {
		t.Fatal(err)
	}
	regranted := mustAcquire(t, s, old.Key, "worker-a", ttl)
	ahead := mustAcquire(t, s, "payout:acct-ahead", "worker-a", ttl)

	refs := []store.LeaseRef{
		{Key: before.Key, Owner: before.Owner, Token: before.Token},
		{Key: other.Key, Owner: maxOwner, Token: other.Token},
		{Key: old.Key, Owner: old.Owner, Token: old.Token},
		{Key: ahead.Key, Owner: ahead.Owner, Token: ahead.Token + 1},
		{Key: "payout:acct-free", Owner: "worker-a", Token: live.Token},
		{Key: live.Key, Owner: live.Owner, Token: live.Token},
		{Key: live.Key, Owner: live.Owner, Token: live.Token},
	}
	want := []error{nil, store.ErrNotHeld, store.ErrStaleToken, store.ErrNotHeld, store.ErrNotHeld, nil, store.ErrInvalidArgument}
	got := s.ReleaseMany(ctxT(t), refs)
	for i, err := range got {
		if (want[i] == nil) != (err == nil) || !errors.Is(err, want[i]) {
			t.Errorf("member %d (%s of %q, token %d): %v; want %v", i, refs[i].Key, refs[i].Owner, refs[i].Token, err, want[i])
		}
	}
	for _, l := range []store.Lease{other, regranted, ahead} {
		st, err := s.Inspect(ctxT(t), l.Key)
		if err != nil || st.Lease == nil || st.Lease.Token != l.Token {
			t.Errorf("%s after the batch: %+v, %v; want grant %d live", l.Key, st.Lease, err, l.Token)
		}
	}
	for _, l := range []store.Lease{before, live} {
		if st, err := s.Inspect(ctxT(t), l.Key); err != nil || st.Lease != nil {
			t.Errorf("%s after the batch: %+v, %v; want it free", l.Key, st.Lease, err)
		}
	}
}
