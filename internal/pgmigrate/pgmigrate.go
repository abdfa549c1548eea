// Package pgmigrate applies a component's embedded SQL migrations with
// goose (github.com/pressly/goose/v3). Each component owns its migrations
// (lockdb by lockserver/store/pgstore, paydb by functions/paymentresource,
// raildb by functions/railproxy) and its own version table, so that two
// components can never take each other's tables even in one database.
package pgmigrate

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// UpPool is Up over a pgx pool (a Cloud SQL pool included): the
// migrations run on the pool's own connections.
func UpPool(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, dir, table string, lockID int64) error {
	db := stdlib.OpenDBFromPool(pool) // closing db leaves the pool open
	defer db.Close()
	return Up(ctx, db, fsys, dir, table, lockID)
}

// Up applies every pending migration of fsys (the *.sql files in its
// directory dir) to db, recording versions in table and holding the PostgreSQL advisory
// lock lockID for the whole run, so that several instances starting at once
// apply each migration exactly once (a waiting instance polls the lock every
// second for up to five minutes). It returns nil when nothing is pending.
func Up(ctx context.Context, db *sql.DB, fsys fs.FS, dir, table string, lockID int64) error {
	sub, err := fs.Sub(fsys, dir)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID), lock.WithLockTimeout(1, 300))
	if err != nil {
		return fmt.Errorf("migration locker: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, sub,
		goose.WithTableName(table),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}
