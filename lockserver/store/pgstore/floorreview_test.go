package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// Tests from a review of ADR 0002 (the token floor): each names what it
// shows.

// TestAnAdvanceToTheLargestPastKeepsTokensBelow2To53: lockctl advance
// accepts N up to 2^53 - 1 (MaxAdvancePast) "so that every JSON client
// reads tokens exactly", and the restore runbook tells the operator to add
// a margin to N. Every token after the advance is above N, so it is 2^53 or
// more; a JSON client (float64) reads 2^53 and 2^53 + 1 as the same
// number: two holders it cannot tell apart. Nothing in the draw refuses a
// sequence beyond the range (only lockdb_catch_up refuses a clock beyond
// it). Want: the grant refused (ErrUnavailable, as for a clock past the
// range), or every token at most 2^53 - 1.
func TestAnAdvanceToTheLargestPastKeepsTokensBelow2To53(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s := openStore(t, dsn)
	grantRelease(t, s, "payout:acct-1", 1)
	if _, err := s.Advance(testCtx(t), store.MaxAdvancePast-1); err != nil {
		t.Fatalf("Advance to MaxAdvancePast - 1: %v", err)
	}
	// An acquire draws twice (VALUES and DO UPDATE), a handoff once, so
	// the two grants below carry consecutive tokens.
	var exact []float64
	l, err := s.Acquire(testCtx(t), "payout:acct-1", "worker-a", testTTL)
	if err != nil {
		if !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("Acquire after the advance: %v; want a token up to 2^53 - 1 or ErrUnavailable", err)
		}
		if st, err := s.Inspect(testCtx(t), "payout:acct-1"); err != nil || st.Lease != nil || st.LastToken > store.MaxAdvancePast {
			t.Fatalf("after the refusal: %+v, last token %d, %v; want nothing granted", st.Lease, st.LastToken, err)
		}
		res := s.AcquireMany(testCtx(t), []store.AcquireRequest{{Key: "payout:acct-2", Owner: "worker-a", TTL: testTTL}})
		if res[0].Err == nil && res[0].Lease.Token > store.MaxAdvancePast {
			t.Fatalf("AcquireMany granted token %d, beyond 2^53 - 1", res[0].Lease.Token)
		}
		if res[0].Err != nil && !errors.Is(res[0].Err, store.ErrUnavailable) {
			t.Fatalf("AcquireMany after the advance: %v; want ErrUnavailable", res[0].Err)
		}
		return
	}
	exact = append(exact, float64(l.Token))
	if l.Token > store.MaxAdvancePast {
		t.Errorf("Acquire granted token %d, beyond 2^53 - 1", l.Token)
	}
	h, err := s.Handoff(testCtx(t), store.LeaseRef{Key: l.Key, Owner: l.Owner, Token: l.Token},
		store.AcquireRequest{Key: l.Key, Owner: "worker-b", TTL: testTTL})
	if err != nil {
		t.Logf("Handoff refused: %v", err)
	} else {
		exact = append(exact, float64(h.Token))
		if h.Token > store.MaxAdvancePast {
			t.Errorf("Handoff granted token %d, beyond 2^53 - 1", h.Token)
		}
	}
	for i := 1; i < len(exact); i++ {
		if exact[i] <= exact[i-1] {
			t.Errorf("as a JSON client reads them, grant %d's token (%.0f) is not above grant %d's (%.0f): two holders with one token", i, exact[i], i-1, exact[i-1])
		}
	}
}

// TestASequenceSetBackWithinASecondRepeatsNoToken: the ADR and the restore
// runbook say a rollback less than a second old is still caught by the
// key's row check and by the lock-server that issued the tokens. But a
// rollback of the sequence alone (ALTER SEQUENCE RESTART, setval) is
// instant, and the row check compares a draw with its own key's row only:
// tokens issued to other keys since the value the sequence went back to
// are issued again, to a new key and to an old key whose row is below
// them, by any other lock-server.
func TestASequenceSetBackWithinASecondRepeatsNoToken(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	issuing, other := openStore(t, dsn), openStore(t, dsn)
	// Start from a caught-up sequence, so the steps below run well within
	// the floor's second.
	execSQL(t, dsn, `SELECT lockdb_catch_up()`)
	issued := map[int64]string{}
	old := grantRelease(t, issuing, "payout:acct-old", 1)
	issued[old] = "payout:acct-old"
	for i := range 4 {
		k := fmt.Sprintf("payout:acct-%d", i)
		issued[grantRelease(t, issuing, k, 1)] = k
	}
	execSQL(t, dsn, fmt.Sprintf(`SELECT setval('fencing_token_seq', %d)`, old))
	for _, k := range []string{"payout:acct-old", "payout:acct-new"} {
		l, err := other.Acquire(testCtx(t), k, "worker-b", testTTL)
		switch {
		case errors.Is(err, store.ErrBackendRestored):
			t.Logf("%s refused: %v", k, err)
		case err != nil:
			t.Fatalf("Acquire %s: %v", k, err)
		case issued[l.Token] != "":
			t.Errorf("the other lock-server granted %s token %d, already issued to %s", k, l.Token, issued[l.Token])
		default:
			t.Logf("%s: token %d, not issued before", k, l.Token)
		}
	}
}

// TestNoTokenRepeatsUnderGrantsAndCatchUps: two stores (two lock-servers)
// and eight clients grant, hand off, group-grant and release six keys while
// lockdb's clock is stepped forward by more than the floor's second again
// and again (each step makes the next draw run a catch-up) and Advance
// runs now and then. No token may be issued twice, each key's tokens must
// strictly increase in the order its holders held it, and no call may fail
// other than with ErrLockHeld (a deadlock would show up as SQLSTATE 40P01
// or as the test's deadline), or with a draw still behind the clock after
// the one catch-up (the steps here come several a second, so the clock
// moves on between a catch-up and the draw after it; that is
// TestADrawBehindTheClockAfterTheCatchUpIsUnavailable, counted here).
func TestNoTokenRepeatsUnderGrantsAndCatchUps(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	stores := []*Store{openStore(t, dsn), openStore(t, dsn)}
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5"}
	const (
		clients = 8
		ops     = 120
		ttl     = 10 * time.Minute // the longest allowed; the steps add up to less
	)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	var (
		mu     sync.Mutex
		byKey  = map[string][]int64{} // appended by the holder, in holding order
		issued = map[int64]string{}
		errs   []error
		behind int // refusals still behind the clock after the catch-up
	)
	note := func(key string, token int64) {
		mu.Lock()
		defer mu.Unlock()
		byKey[key] = append(byKey[key], token)
		if k, dup := issued[token]; dup {
			errs = append(errs, fmt.Errorf("token %d issued twice: %s and %s", token, k, key))
		}
		issued[token] = key
	}
	fail := func(what string, err error) {
		mu.Lock()
		defer mu.Unlock()
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == sqlstateBehindClock {
			behind++
			return
		}
		if errors.As(err, &pgErr) {
			what += " (SQLSTATE " + pgErr.Code + ")"
		}
		errs = append(errs, fmt.Errorf("%s: %w", what, err))
	}

	// The clock stepper: one step of 1.1 s each time a client asks (every
	// few operations), on a connection of its own.
	steps := make(chan struct{}, clients)
	stepperDone := make(chan struct{})
	var offset time.Duration
	go func() {
		defer close(stepperDone)
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			fail("stepper connect", err)
			for range steps { // keep the clients going
			}
			return
		}
		defer conn.Close(context.Background())
		for range steps {
			offset += 1100 * time.Millisecond
			_, err := conn.Exec(ctx, fmt.Sprintf(`CREATE OR REPLACE FUNCTION lock_clock() RETURNS timestamptz
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$ SELECT clock_timestamp() + interval '%d microseconds' $$`, offset.Microseconds()))
			if err != nil {
				fail("step the clock", err)
			}
		}
	}()

	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 2026))
			owner := fmt.Sprintf("client-%d", c)
			for i := range ops {
				s := stores[rng.IntN(len(stores))]
				if i%10 == c%10 {
					steps <- struct{}{}
				}
				switch r := rng.IntN(10); {
				case r == 0: // Advance to a token already issued: moves nothing down
					mu.Lock()
					var past int64 = 1
					for tok := range issued {
						past = max(past, tok-int64(rng.IntN(1000)))
					}
					mu.Unlock()
					if _, err := s.Advance(ctx, past); err != nil {
						fail("Advance", err)
					}
				case r <= 3: // a group grant of three keys
					perm := rng.Perm(len(keys))[:3]
					reqs := make([]store.AcquireRequest, len(perm))
					for j, p := range perm {
						reqs[j] = store.AcquireRequest{Key: keys[p], Owner: owner, TTL: ttl}
					}
					var held []store.Lease
					for j, res := range s.AcquireMany(ctx, reqs) {
						switch {
						case res.Err == nil:
							note(reqs[j].Key, res.Lease.Token)
							held = append(held, res.Lease)
						case !errors.Is(res.Err, store.ErrLockHeld):
							fail("AcquireMany "+reqs[j].Key, res.Err)
						}
					}
					for _, l := range held {
						if err := s.Release(ctx, l.Key, owner, l.Token); err != nil {
							fail("Release "+l.Key, err)
						}
					}
				default: // acquire, maybe hand off, release
					key := keys[rng.IntN(len(keys))]
					l, err := s.Acquire(ctx, key, owner, ttl)
					if errors.Is(err, store.ErrLockHeld) {
						continue
					}
					if err != nil {
						fail("Acquire "+key, err)
						continue
					}
					note(key, l.Token)
					if rng.IntN(2) == 0 {
						next, err := stores[rng.IntN(len(stores))].Handoff(ctx,
							store.LeaseRef{Key: key, Owner: owner, Token: l.Token},
							store.AcquireRequest{Key: key, Owner: owner + "-next", TTL: ttl})
						if err != nil {
							fail("Handoff "+key, err)
							continue
						}
						note(key, next.Token)
						l, owner = next, owner+"-next"
					}
					if err := s.Release(ctx, key, owner, l.Token); err != nil {
						fail("Release "+key, err)
					}
					owner = fmt.Sprintf("client-%d", c)
				}
			}
		}()
	}
	wg.Wait()
	close(steps)
	<-stepperDone

	for _, err := range errs {
		t.Error(err)
	}
	grants := 0
	for _, k := range keys {
		toks := byKey[k]
		grants += len(toks)
		if !sort.SliceIsSorted(toks, func(i, j int) bool { return toks[i] < toks[j] }) {
			t.Errorf("key %s: tokens not increasing in holding order: %v", k, toks)
		}
	}
	t.Logf("%d grants over %d keys, clock stepped by %v; %d calls refused as still behind the clock", grants, len(keys), offset, behind)
}

// TestADrawBehindTheClockAfterTheCatchUpIsUnavailable: drawing runs one
// catch-up and sends the grant once more; when that second draw is again
// more than a second behind lockdb's clock (the clock moved on by more
// than a second between the catch-up and the draw: a step, or a retry
// that waited that long for the key's row), the DL002 goes back to the
// caller as a plain error, which lock-server answers 500 INTERNAL, though
// nothing was granted and asking again is right. Here every reading of
// lock_clock() is two seconds after the one before, so every draw is
// behind. Want: ErrUnavailable (503 BACKEND_UNAVAILABLE, retried by the
// SDK), as for a clock past the token range.
func TestADrawBehindTheClockAfterTheCatchUpIsUnavailable(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	s := openStore(t, dsn)
	grantRelease(t, s, "payout:acct-1", 1)
	execSQL(t, dsn, `CREATE SEQUENCE review_clock_jumps`)
	execSQL(t, dsn, `CREATE OR REPLACE FUNCTION lock_clock() RETURNS timestamptz
LANGUAGE sql VOLATILE
AS $$ SELECT clock_timestamp() + nextval('review_clock_jumps') * interval '2 seconds' $$`)
	_, err := s.Acquire(testCtx(t), "payout:acct-1", "worker-a", testTTL)
	if !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Acquire with every draw behind the clock: %v; want ErrUnavailable", err)
	}
	res := s.AcquireMany(testCtx(t), []store.AcquireRequest{{Key: "payout:acct-1", Owner: "worker-a", TTL: testTTL}})
	if !errors.Is(res[0].Err, store.ErrUnavailable) {
		t.Errorf("AcquireMany with every draw behind the clock: %v; want ErrUnavailable", res[0].Err)
	}
}

// TestARollbackAfterAnAdvancePastTheClockIsCaught: the restore runbook
// tells the operator to add a margin to N before lockctl advance ("a token
// skipped costs nothing"), and Advance accepts any N up to 2^53 - 1. An N
// ahead of lockdb's clock puts the sequence ahead of it, and the floor
// notices a rollback only once the sequence is a second behind the clock:
// until the clock catches up with N (a margin of a day: a day), a
// rollback older than a second is not caught, and another lock-server
// issues tokens again. The ADR lists the draws' rate and a clock stepped
// back as what puts the sequence ahead, not an advance.
func TestARollbackAfterAnAdvancePastTheClockIsCaught(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	issuing, other := openStore(t, dsn), openStore(t, dsn)
	first := grantRelease(t, issuing, "payout:acct-1", 1)
	// N: the largest token issued, with a margin of a day's microseconds.
	if _, err := issuing.Advance(testCtx(t), first+(24*time.Hour).Microseconds()); err != nil {
		t.Fatal(err)
	}
	backup := grantRelease(t, issuing, "payout:acct-1", 1) // the state a backup keeps
	issued := map[int64]bool{backup: true}
	for i := range 3 {
		issued[grantRelease(t, issuing, fmt.Sprintf("payout:acct-%d", i+2), 1)] = true
	}
	// The sequence goes back to the backup's value, a minute later.
	execSQL(t, dsn, fmt.Sprintf(`SELECT setval('fencing_token_seq', %d)`, backup))
	stepClock(t, dsn, time.Minute)
	l, err := other.Acquire(testCtx(t), "payout:acct-new", "worker-b", testTTL)
	switch {
	case errors.Is(err, store.ErrBackendRestored):
		t.Logf("refused: %v", err)
	case err != nil:
		t.Fatal(err)
	case issued[l.Token]:
		t.Errorf("after a rollback a minute old, the other lock-server granted token %d again", l.Token)
	}
}

// TestCommitsAreDurableWhateverTheRoleOrDatabaseSays: synchronous_commit
// = off set for lockdb or for lock-server's role, not for the server, is
// overridden as well (not a bug: a review check).
func TestCommitsAreDurableWhateverTheRoleOrDatabaseSays(t *testing.T) {
	c, dsn := newClusterDB(t)
	execSQL(t, c.AdminDSN(), `ALTER DATABASE lockdb SET synchronous_commit = off`)
	execSQL(t, c.AdminDSN(), `ALTER ROLE CURRENT_USER SET synchronous_commit = off`)
	s := openStore(t, dsn)
	var got string
	if err := s.pool.QueryRow(testCtx(t), `SHOW synchronous_commit`).Scan(&got); err != nil || got != "on" {
		t.Fatalf("the store's session: synchronous_commit %q, %v; want on", got, err)
	}
}

// TestCommitsStayDurableWhenTheServerIsReloadedWithSynchronousCommitOff:
// the store sets synchronous_commit for its sessions, and a session's
// setting outranks the configuration file, so a reload with
// synchronous_commit = off after Open changes nothing for the store (not
// a bug: a review check).
func TestCommitsStayDurableWhenTheServerIsReloadedWithSynchronousCommitOff(t *testing.T) {
	c, dsn := newClusterDB(t)
	s := openStore(t, dsn)
	grantRelease(t, s, "payout:acct-1", 1)
	reloadWith(t, c.AdminDSN(), "synchronous_commit", "off")
	for range 3 { // each pooled connection the store may hand out
		var got string
		if err := s.pool.QueryRow(testCtx(t), `SHOW synchronous_commit`).Scan(&got); err != nil || got != "on" {
			t.Fatalf("the store's session after the reload: synchronous_commit %q, %v; want on", got, err)
		}
	}
}

// reloadWith sets a server parameter with ALTER SYSTEM (value "" resets
// it), reloads the configuration, and waits until a new session sees the
// value: the postmaster has read the file, and every backend has been
// signalled to read it before its next statement.
func reloadWith(t *testing.T, admin, name, value string) {
	t.Helper()
	set := fmt.Sprintf(`ALTER SYSTEM SET %s = %s`, name, value)
	if value == "" {
		set = `ALTER SYSTEM RESET ` + name
	}
	execSQL(t, admin, set)
	execSQL(t, admin, `SELECT pg_reload_conf()`)
	for {
		var got string
		conn, err := pgx.Connect(testCtx(t), admin)
		if err != nil {
			t.Fatal(err)
		}
		err = conn.QueryRow(testCtx(t), `SELECT current_setting($1)`, name).Scan(&got)
		_ = conn.Close(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		if got == value || value == "" && got == "on" {
			return
		}
	}
}

// TestGrantsAreRefusedOnceFsyncIsReloadedOff: fsync turned off by a
// reload after Open (the connections are not new, so the check at connect
// cannot see it) refuses every grant with ErrNotDurable, fails readiness,
// and logs why once; grants resume when fsync is on again.
func TestGrantsAreRefusedOnceFsyncIsReloadedOff(t *testing.T) {
	c, dsn := newClusterDB(t)
	var lines logLines
	s, err := Open(testCtx(t), conf(func(c *Config) { c.DSN = dsn }), lines.logger())
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()
	grantRelease(t, s, "payout:acct-1", 1)
	reloadWith(t, c.AdminDSN(), "fsync", "off")
	for i := range 3 { // each pooled connection the store may hand out
		l, err := s.Acquire(testCtx(t), fmt.Sprintf("payout:acct-%d", i+2), "worker-a", testTTL)
		if !errors.Is(err, ErrNotDurable) || !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("Acquire with fsync off = %+v, %v; want an error wrapping ErrNotDurable and ErrUnavailable", l, err)
		}
	}
	if got := s.AcquireMany(testCtx(t), []store.AcquireRequest{{Key: "payout:acct-9", Owner: "worker-a", TTL: testTTL}}); !errors.Is(got[0].Err, ErrNotDurable) {
		t.Fatalf("AcquireMany with fsync off = %+v; want ErrNotDurable", got)
	}
	if err := s.Ping(testCtx(t)); !errors.Is(err, ErrNotDurable) {
		t.Fatalf("Ping with fsync off = %v; want ErrNotDurable (readiness fails)", err)
	}
	if got := lines.events(t, eventNotDurable); len(got) != 1 || got[0]["level"] != "ERROR" {
		t.Fatalf("%s lines = %v; want one at ERROR", eventNotDurable, got)
	}
	reloadWith(t, c.AdminDSN(), "fsync", "")
	grantRelease(t, s, "payout:acct-1", 1)
	if err := s.Ping(testCtx(t)); err != nil {
		t.Fatalf("Ping with fsync on again: %v", err)
	}
}
