package railproxy

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
	// migrationTable records the applied versions of raildb.
	migrationTable = "railproxy_goose_version"
	// migrationLockID is the advisory lock that serialises concurrent
	// migrations (several rail-proxy instances starting at once).
	migrationLockID = 0x7261696c6462 // "raildb"
)

// migrate applies the pending migrations of raildb (embedded from
// migrations/, recorded in railproxy_goose_version) through pool, holding
// a PostgreSQL advisory lock so that concurrent callers apply each
// migration once. The pool may dial through the Cloud SQL connector.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := pgmigrate.UpPool(ctx, pool, migrations, "migrations", migrationTable, migrationLockID); err != nil {
		return fmt.Errorf("railproxy: %w", err)
	}
	return nil
}
