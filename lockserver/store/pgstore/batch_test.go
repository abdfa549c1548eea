package pgstore

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/storetest"
)

// naiveAcquireManySQL draws every token before the rows are won (it writes
// the VALUES-side token in DO UPDATE): the regression the interleaving
// below must catch.
var naiveAcquireManySQL = strings.Replace(acquireManySQL,
	"fencing_token = lockdb_draw_token(l.fencing_token)", "fencing_token = EXCLUDED.fencing_token", 1)

// TestBatchTokenRegressionInterleaving is TestTokenRegressionInterleaving
// for a group grant: the slow grant is one AcquireMany statement for three
// keys that blocks on one key's row lock while a fast grant of that key is
// made and released; its token for that key must still be above the fast
// grant's. The naive statement is caught by the same check.
func TestBatchTokenRegressionInterleaving(t *testing.T) {
	checkTokenRegression(t, slowBatchAfterFastGrant, acquireManySQL, naiveAcquireManySQL)
}

// slowBatchAfterFastGrant is slowGrantAfterFastGrant with the slow grant
// made by AcquireMany (statement stmt) for the contested key and two
// others, one sorting before it and one after.
func slowBatchAfterFastGrant(t *testing.T, stmt string) (slow, fast int64) {
	t.Helper()
	const key = "payout:acct-42"
	ctx := testCtx(t)
	dsn := pgtest.NewDatabase(t)
	s := openStore(t, dsn)
	s.acquireManySQL = stmt
	earlier, fast, res := raceAFastGrant(t, ctx, dsn, s, key, acquireSQL, func() <-chan []store.Result {
		done := make(chan []store.Result, 1)
		go func() {
			done <- s.AcquireMany(ctx, []store.AcquireRequest{
				{Key: "a-before", Owner: "slow-worker", TTL: testTTL},
				{Key: key, Owner: "slow-worker", TTL: testTTL},
				{Key: "z-after", Owner: "slow-worker", TTL: testTTL},
			})
		}()
		return done
	})
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("slow AcquireMany member %d: %v", i, r.Err)
		}
	}
	t.Logf("tokens: earlier grant %d, fast grant %d, slow batch %d, %d, %d", earlier, fast, res[0].Lease.Token, res[1].Lease.Token, res[2].Lease.Token)
	return res[1].Lease.Token, fast
}

// TestBatchFailureAnswersEveryMember: a trigger makes the statement fail
// on one key of the batch, after the keys sorting before it were written;
// every member is answered with the error and no key is granted (the
// statement is atomic).
func TestBatchFailureAnswersEveryMember(t *testing.T) {
	ctx := testCtx(t)
	dsn := pgtest.NewDatabase(t)
	s := openStore(t, dsn)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.lock_key = 'zz-poison' THEN RAISE EXCEPTION 'poisoned key %', NEW.lock_key; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER poison BEFORE INSERT OR UPDATE ON lock_lease FOR EACH ROW EXECUTE FUNCTION poison()`); err != nil {
		t.Fatalf("create the trigger: %v", err)
	}
	storetest.CheckBatchFailureAnswersEveryMember(t, s, s, "zz-poison")
}

// TestBatchStatementsTakeRowsInKeyOrder: two batches must never wait for
// each other's rows in a cycle, so every batch statement takes its rows in
// key order: the acquire inserts from a sort on the key, and the release
// and renewal lock their rows (LockRows) above a sort on the key.
func TestBatchStatementsTakeRowsInKeyOrder(t *testing.T) {
	s := openStore(t, pgtest.NewDatabase(t))
	ctx := testCtx(t)
	for name, tc := range map[string]struct {
		stmt string
		args []any
	}{
		"acquireMany": {acquireManySQL, []any{[]string{"b", "a"}, []string{"w", "w"}, []int64{30_000, 30_000}}},
		"releaseMany": {releaseManySQL, []any{[]string{"b", "a"}, []int64{1, 2}, []string{"w", "w"}}},
		"renewMany":   {renewManySQL, []any{[]string{"b", "a"}, []int64{1, 2}, []string{"w", "w"}}},
	} {
		text := explain(t, ctx, s, name, tc.stmt, tc.args...)
		key := regexp.MustCompile(`Sort Key: \w+\.lock_key\b`) // the table's alias is the planner's
		if name == "acquireMany" {
			key = regexp.MustCompile(`Sort Key: r\.k\b`)
		}
		loc := key.FindStringIndex(text)
		if loc == nil {
			t.Errorf("plan of %s has no sort on the key:\n%s", name, text)
			continue
		}
		if name != "acquireMany" {
			if lock := strings.Index(text, "LockRows"); lock < 0 || lock > loc[0] {
				t.Errorf("plan of %s does not lock rows above the sort on the key:\n%s", name, text)
			}
		}
	}
}
