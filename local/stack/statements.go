package stack

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Statement statistics: with Config.StatementStats, every PostgreSQL
// cluster of the stack loads PostgreSQL's own pg_stat_statements module,
// which counts each normalized statement (constants replaced by $n) per
// database as the server executes it. With pg_stat_statements.track=top
// only the statements the services send are counted, not those run inside
// them (a foreign-key check, a function's body), so the calls of a
// database are the statements the services sent it: one round trip each
// for pgx, BEGIN and COMMIT included, a pgx.Batch being one round trip
// for several. The figures are kept in shared memory only
// (pg_stat_statements.save=off): a cluster restarted by Kill or Restart
// starts again from zero.

// statementSettings are the server parameters of Config.StatementStats.
var statementSettings = map[string]string{
	"shared_preload_libraries": "pg_stat_statements",
	"pg_stat_statements.track": "top",
	"pg_stat_statements.save":  "off",
	"pg_stat_statements.max":   "5000",
}

// adminDatabase is the cluster's maintenance database, where the
// extension's view is created and read; its own statements are left out
// of StatementStats.
const adminDatabase = "postgres"

// ErrNoStatementStats: StatementStats or ResetStatementStats was called on
// a stack started without Config.StatementStats.
var ErrNoStatementStats = errors.New("stack: started without statement statistics (Config.StatementStats)")

// StatementStat is one normalized statement as one database of the stack
// served it (a row of pg_stat_statements).
type StatementStat struct {
	// Cluster is the PostgreSQL cluster's name: "paydb" (databases paydb
	// and raildb) or "lockdb".
	Cluster string `json:"cluster"`
	// Database is the database the statement ran in.
	Database string `json:"database"`
	// Calls counts its executions since the last reset.
	Calls int64 `json:"calls"`
	// TotalMs is the time the server spent executing it over those calls,
	// in milliseconds (pg_stat_statements' total_exec_time: planning and
	// the round trip not included).
	TotalMs float64 `json:"totalMs"`
	// Query is its text, constants replaced by $1, $2, ..., whitespace
	// runs folded to one space.
	Query string `json:"query"`
}

// enableStatementStats creates the extension's view in c's maintenance
// database (the module itself is loaded by statementSettings).
func enableStatementStats(ctx context.Context, c namedCluster) error {
	return withAdminConn(ctx, c, func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`)
		return err
	})
}

// withAdminConn calls f with a connection to c's maintenance database,
// closed after; its errors name the cluster.
func withAdminConn(ctx context.Context, c namedCluster, f func(context.Context, *pgx.Conn) error) error {
	conn, err := pgx.Connect(ctx, c.DSN(adminDatabase))
	if err == nil {
		err = f(ctx, conn)
		conn.Close(context.WithoutCancel(ctx))
	}
	if err != nil {
		return fmt.Errorf("stack: cluster %s: statement statistics: %w", c.name, err)
	}
	return nil
}

// ResetStatementStats sets the statement statistics of every cluster of
// the stack back to zero (pg_stat_statements_reset), so that the next
// StatementStats counts only what came after. ErrNoStatementStats without
// Config.StatementStats; a cluster's error, naming it.
func (s *Stack) ResetStatementStats(ctx context.Context) error {
	return s.eachCluster(ctx, func(ctx context.Context, c namedCluster, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, `SELECT pg_stat_statements_reset()`)
		return err
	})
}

// StatementStats returns the statements every database of the stack
// served since the start or the last ResetStatementStats, by cluster,
// database and calls (most first); the maintenance database's own
// statements (this call's, among others) are left out.
// ErrNoStatementStats without Config.StatementStats; a cluster's error,
// naming it.
func (s *Stack) StatementStats(ctx context.Context) ([]StatementStat, error) {
	var out []StatementStat
	err := s.eachCluster(ctx, func(ctx context.Context, c namedCluster, conn *pgx.Conn) error {
		rows, err := conn.Query(ctx, `SELECT d.datname, s.calls, s.total_exec_time, s.query
			FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
			WHERE d.datname <> $1 ORDER BY d.datname, s.calls DESC, s.query`, adminDatabase)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			st := StatementStat{Cluster: c.name}
			if err := rows.Scan(&st.Database, &st.Calls, &st.TotalMs, &st.Query); err != nil {
				return err
			}
			st.Query = strings.Join(strings.Fields(st.Query), " ")
			out = append(out, st)
		}
		return rows.Err()
	})
	return out, err
}

// eachCluster calls f with a connection to each cluster's maintenance
// database, in the order the clusters started.
func (s *Stack) eachCluster(ctx context.Context, f func(context.Context, namedCluster, *pgx.Conn) error) error {
	if !s.cfg.StatementStats {
		return ErrNoStatementStats
	}
	s.mu.Lock()
	clusters := append([]namedCluster(nil), s.clusters...)
	s.mu.Unlock()
	for _, c := range clusters {
		if err := withAdminConn(ctx, c, func(ctx context.Context, conn *pgx.Conn) error { return f(ctx, c, conn) }); err != nil {
			return err
		}
	}
	return nil
}
