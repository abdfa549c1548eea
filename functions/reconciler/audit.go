package reconciler

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutaudit"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
)

// Environment variables of the audit the reconciler runs after each pass
// (all three set, or none: no audit). Read by cmd/reconciler.
const (
	// EnvAuditPaydbURL is a PostgreSQL DSN of paydb (read only).
	EnvAuditPaydbURL = "RECONCILER_AUDIT_PAYDB_URL"
	// EnvAuditRaildbURL is a PostgreSQL DSN of raildb (read only).
	EnvAuditRaildbURL = "RECONCILER_AUDIT_RAILDB_URL"
	// EnvAuditRailURL is the rail's base URL: its journal is read at
	// GET /submissions.
	EnvAuditRailURL = "RECONCILER_AUDIT_RAIL_URL"
)

// AuditEnvNames lists the audit's variables.
func AuditEnvNames() []string { return []string{EnvAuditPaydbURL, EnvAuditRaildbURL, EnvAuditRailURL} }

// maxJournalBytes bounds the rail journal read by the audit (64 MiB).
const maxJournalBytes = 64 << 20

// DBAuditor returns an Auditor that runs payoutaudit.Live over paydb and
// raildb (opened from the DSNs) and the rail's journal at railURL +
// rail.PathJournal, read through d, with settle between its two looks
// (Config.AuditSettle); close releases the pools. It returns nil, nil,
// nil when all three are empty, and an error wrapping ErrInvalidConfig
// when only some are set or settle is not positive.
//
// The audit runs while executors work, so it reads the books first and
// the rail's journal last (the pipeline's causal order: a debit is posted
// only after the rail answered ACK) and looks again at what only a payout
// in flight can explain before reporting it; see payoutaudit.Live. Before
// this, the journal was read first, and a payout the rail paid and paydb
// posted between the two reads was reported as a debit without a rail
// payment (docs/gameday.md).
func DBAuditor(ctx context.Context, paydbDSN, raildbDSN, railURL string, settle time.Duration, d interface {
	Do(*http.Request) (*http.Response, error)
}) (Auditor, func(), error) {
	set := 0
	for _, v := range []string{paydbDSN, raildbDSN, railURL} {
		if v != "" {
			set++
		}
	}
	if set == 0 {
		return nil, nil, nil
	}
	if set == 3 && settle <= 0 {
		return nil, nil, fmt.Errorf("%w: %s: audit settle %v must be positive", ErrInvalidConfig, EnvAuditSettleMs, settle)
	}
	if set != 3 {
		return nil, nil, fmt.Errorf("%w: set all of %s, %s and %s, or none", ErrInvalidConfig, EnvAuditPaydbURL, EnvAuditRaildbURL, EnvAuditRailURL)
	}
	paydb, err := pgxpool.New(ctx, paydbDSN)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s: %v", ErrInvalidConfig, EnvAuditPaydbURL, err)
	}
	raildb, err := pgxpool.New(ctx, raildbDSN)
	if err != nil {
		paydb.Close()
		return nil, nil, fmt.Errorf("%w: %s: %v", ErrInvalidConfig, EnvAuditRaildbURL, err)
	}
	journal := strings.TrimSuffix(railURL, "/") + rail.PathJournal
	readRail := func(ctx context.Context) ([]rail.Submission, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, journal, nil)
		if err != nil {
			return nil, err
		}
		resp, err := d.Do(req)
		if err != nil {
			return nil, fmt.Errorf("read the rail's journal: %w", err)
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(io.LimitReader(resp.Body, maxJournalBytes))
		if err != nil || resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("read the rail's journal: status %d: %v", resp.StatusCode, err)
		}
		var list rail.SubmissionList
		if err := json.Unmarshal(raw, &list); err != nil {
			return nil, fmt.Errorf("decode the rail's journal: %w", err)
		}
		return list.Submissions, nil
	}
	audit := func(ctx context.Context) (payoutaudit.Report, error) {
		return payoutaudit.Live(ctx, paydb, raildb, readRail, nil, payoutaudit.LiveConfig{Settle: settle})
	}
	return audit, func() { paydb.Close(); raildb.Close() }, nil
}
