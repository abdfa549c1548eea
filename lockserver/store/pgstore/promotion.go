package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// Failover to a promoted standby. A promoted standby is on a new timeline,
// which the restore guard refuses like a restore: an asynchronous standby
// may lack acknowledged grants. With Config.AcceptPromotion the store reads
// synchronous_standby_names and synchronous_commit at Open and every
// Config.ReplicationCheckInterval, and remembers per timeline whether
// commits waited for a standby. A grant refused only for a later timeline
// of the same cluster, database and sequence, whose stamped timeline was
// last seen synchronous, moves the stamp (lockdb_promotion_accepted, WARN)
// and is tried once more. The rule's limits are in docs/reliability.md
// ("lockdb failover").

const (
	// replicationSQL reads what decides whether a commit waits for a
	// standby, and the current timeline.
	replicationSQL = `SELECT current_setting('synchronous_standby_names'), current_setting('synchronous_commit'), pg_is_in_recovery(),
    ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int::bigint`

	// stampedSQL reads the stamp and the instance side by side.
	stampedSQL = `SELECT st.system_identifier, st.timeline_id, st.database_oid, st.sequence_oid,
    cur.system_identifier, cur.timeline_id, cur.database_oid, cur.sequence_oid
FROM lockdb_identity st, lockdb_current_identity() cur`

	// restampTimelineSQL moves the stamp to the current timeline, keeping
	// everything else.
	restampTimelineSQL = `UPDATE lockdb_identity SET timeline_id = $1, stamped_at = clock_timestamp()`
)

// DefaultReplicationCheckInterval is the default Config.ReplicationCheckInterval.
const DefaultReplicationCheckInterval = 5 * time.Second

// Log events of the promotion rule.
const (
	// EventPromotionAccepted (WARN): lockdb is on a later timeline than its
	// stamp, the stamped timeline was synchronously replicated, and grants
	// go on; the stamp now names the new timeline.
	EventPromotionAccepted = "lockdb_promotion_accepted"
	// EventReplicationAsync (WARN): AcceptPromotion is set, but lockdb's
	// commits do not wait for a standby (at Open, and whenever a check finds
	// it so after finding it synchronous): a failover now is refused as a
	// restore would be.
	EventReplicationAsync = "lockdb_replication_async"
	// EventReplicationSync (INFO): a check found commits waiting for a
	// standby (at Open, and after having found them not waiting).
	EventReplicationSync = "lockdb_replication_sync"
)

// Replication is what one check found.
type Replication struct {
	// Timeline is the server's current timeline.
	Timeline int64
	// StandbyNames and Commit are synchronous_standby_names and
	// synchronous_commit as the server reports them.
	StandbyNames, Commit string
	// Synchronous: StandbyNames is set and Commit is on or remote_apply,
	// so every acknowledged commit is on a standby's disk.
	Synchronous bool
}

// CheckReplication reads whether lockdb's commits wait for a standby and
// records the answer for the current timeline (the promotion rule above
// reads it). Errors wrap store.ErrUnavailable.
func (s *Store) CheckReplication(ctx context.Context) (Replication, error) {
	var (
		r     Replication
		inRec bool
	)
	if err := s.pool.QueryRow(ctx, replicationSQL).Scan(&r.StandbyNames, &r.Commit, &inRec, &r.Timeline); err != nil {
		return Replication{}, unavailable("check replication", "", err)
	}
	r.Synchronous = !inRec && r.StandbyNames != "" && (r.Commit == "on" || r.Commit == "remote_apply")
	s.replMu.Lock()
	prev, seen := s.syncByTimeline[r.Timeline]
	s.syncByTimeline[r.Timeline] = r.Synchronous
	s.replMu.Unlock()
	if !seen || prev != r.Synchronous {
		if r.Synchronous {
			s.log.Info("lockdb commits wait for a synchronous standby: a promotion of that standby will be accepted", "event", EventReplicationSync,
				"timeline", r.Timeline, "synchronousStandbyNames", r.StandbyNames, "synchronousCommit", r.Commit)
		} else {
			s.log.Warn("lockdb commits do not wait for a standby: a promoted standby may lack acknowledged grants, so a failover will refuse grants until lockctl advance (docs/runbooks/lockdb-failover.md)",
				"event", EventReplicationAsync, "timeline", r.Timeline, "synchronousStandbyNames", r.StandbyNames, "synchronousCommit", r.Commit)
		}
	}
	return r, nil
}

// watchReplication runs CheckReplication every interval until stop is
// closed; it exits then (Close waits for it).
func (s *Store) watchReplication(interval time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), interval)
			_, err := s.CheckReplication(ctx)
			cancel()
			if err != nil {
				s.log.Debug("pgstore replication check failed", "error", err.Error())
			}
		}
	}
}

// acceptPromotion applies the promotion rule after the guard refused a
// grant: it reports true when grants may be tried again (the stamp was
// moved to the current timeline, by this call or a concurrent one), false
// when the refusal stands. Errors are the database's.
func (s *Store) acceptPromotion(ctx context.Context) (bool, error) {
	if !s.acceptPromotions {
		return false, nil
	}
	var accepted bool
	var from, to int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, guardLockSQL); err != nil {
			return err
		}
		var st, cur [4]int64
		if err := tx.QueryRow(ctx, stampedSQL).Scan(&st[0], &st[1], &st[2], &st[3], &cur[0], &cur[1], &cur[2], &cur[3]); err != nil {
			return err
		}
		if st == cur {
			accepted = true // a concurrent grant moved it
			return nil
		}
		s.replMu.Lock()
		wasSync := s.syncByTimeline[st[1]]
		s.replMu.Unlock()
		if st[0] != cur[0] || st[2] != cur[2] || st[3] != cur[3] || cur[1] <= st[1] || !wasSync {
			return nil
		}
		if _, err := tx.Exec(ctx, restampTimelineSQL, cur[1]); err != nil {
			return err
		}
		accepted, from, to = true, st[1], cur[1]
		return nil
	})
	if err != nil {
		return false, err
	}
	if from != 0 {
		s.log.Warn("lockdb is a promoted synchronous standby: grants go on, on the new timeline (docs/runbooks/lockdb-failover.md)",
			"event", EventPromotionAccepted, "fromTimeline", from, "toTimeline", to)
		// Learn at once whether the new primary is replicated in its turn.
		if _, err := s.CheckReplication(ctx); err != nil {
			s.log.Debug("pgstore replication check failed", "error", err.Error())
		}
	}
	return accepted, nil
}

// promoted is called with the error of a guarded grant: when it is the
// guard's refusal and the promotion rule accepts the new timeline, it
// returns true (try the grant once more).
func (s *Store) promoted(ctx context.Context, err error) bool {
	if !s.acceptPromotions || !errors.Is(err, store.ErrBackendRestored) {
		return false
	}
	ok, aerr := s.acceptPromotion(ctx)
	if aerr != nil {
		s.log.Debug("pgstore promotion check failed", "error", fmt.Sprint(aerr))
	}
	return ok
}
