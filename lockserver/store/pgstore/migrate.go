package pgstore

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgmigrate"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migration bookkeeping, kept apart from other components' goose
// migrations should they ever share a database.
const (
	// migrationTable records the applied versions of lockdb.
	migrationTable = "pgstore_goose_version"
	// migrationLockID is the advisory lock that serialises concurrent
	// Migrate calls (several lock-servers starting at once).
	migrationLockID = 0x6c6f636b6462 // "lockdb"
)

// Migrate applies the pending migrations of lockdb (embedded from
// migrations/, recorded in table pgstore_goose_version) to the database of
// dsn, holding a PostgreSQL advisory lock so that concurrent callers apply
// each migration once. It returns nil when nothing is pending. Errors wrap
// ErrInvalidConfig for a malformed dsn, store.ErrUnavailable when the
// database cannot be reached, or describe the failed migration.
func Migrate(ctx context.Context, dsn string) error {
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return fmt.Errorf("%w: DSN: %v", ErrInvalidConfig, err)
	}
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = DefaultConnectTimeout
	}
	db := stdlib.OpenDB(*cc)
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		return unavailable("migrate", "", err)
	}
	if err := pgmigrate.Up(ctx, db, migrations, "migrations", migrationTable, migrationLockID); err != nil {
		return fmt.Errorf("pgstore: %w", err)
	}
	return nil
}
