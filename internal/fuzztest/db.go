package fuzztest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Tables is a summary of every table of a database's public schema
// (goose's version table aside): table name -> row count and a digest of
// the rows' JSON, with the columns in VolatileColumns left out.
type Tables map[string]string

// VolatileColumns change without a request (the outbox publisher stamps
// published_at in the background), so snapshots leave them out.
var VolatileColumns = []string{"published_at"}

// Snapshot summarises the tables of the database pool is connected to,
// in one query.
func Snapshot(ctx context.Context, pool *pgxpool.Pool) (Tables, error) {
	rows, err := pool.Query(ctx, `SELECT table_name FROM information_schema.tables
		WHERE table_schema = 'public' AND table_type = 'BASE TABLE' AND table_name <> 'goose_db_version' ORDER BY 1`)
	if err != nil {
		return nil, err
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		names = append(names, n)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	drop := ""
	for _, c := range VolatileColumns {
		drop += " - '" + c + "'"
	}
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf(`SELECT %s AS t, count(*) || ' ' || coalesce(md5(string_agg((to_jsonb(x)%s)::text, ',' ORDER BY (to_jsonb(x)%s)::text)), '') AS d FROM %s x`,
			quoteLiteral(n), drop, drop, quoteIdent(n)))
	}
	out := Tables{}
	if len(parts) == 0 {
		return out, nil
	}
	rows, err = pool.Query(ctx, strings.Join(parts, " UNION ALL "))
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var t, d string
		if err := rows.Scan(&t, &d); err != nil {
			return nil, err
		}
		out[t] = d
	}
	return out, rows.Err()
}

// Changed returns the tables whose summary differs between s and after,
// sorted.
func (s Tables) Changed(after Tables) []string {
	var out []string
	for _, t := range slices.Sorted(maps.Keys(s)) {
		if after[t] != s[t] {
			out = append(out, t)
		}
	}
	for t := range after {
		if _, ok := s[t]; !ok {
			out = append(out, t)
		}
	}
	return out
}

func quoteIdent(s string) string   { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
func quoteLiteral(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }
