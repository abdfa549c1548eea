package paymentresource

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgmigrate"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migration bookkeeping, kept apart from other components' goose
// migrations should they ever share a database.
const (
	// migrationTable records the applied versions of paydb.
	migrationTable = "paymentresource_goose_version"
	// migrationLockID is the advisory lock that serialises concurrent
	// migrations (several instances starting at once).
	migrationLockID = 0x7061796462 // "paydb"
)

// migrate applies the pending migrations of paydb (embedded from
// migrations/, recorded in paymentresource_goose_version) through pool, so
// that a Cloud SQL connection is used like any other, holding a PostgreSQL
// advisory lock so that concurrent callers apply each migration once.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := pgmigrate.UpPool(ctx, pool, migrations, "migrations", migrationTable, migrationLockID); err != nil {
		return fmt.Errorf("paymentresource: %w", err)
	}
	return nil
}
