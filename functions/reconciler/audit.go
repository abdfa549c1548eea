package reconciler

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutaudit"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
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

// DBAuditor returns an Auditor that runs payoutaudit.Run over paydb and
// raildb (opened from the DSNs) and the rail's journal at railURL +
// "/submissions", read through d; close releases the pools. It returns
// nil, nil, nil when all three are empty, and an error wrapping
// ErrInvalidConfig when only some are set.
func DBAuditor(ctx context.Context, paydbDSN, raildbDSN, railURL string, d interface {
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
	journal := strings.TrimSuffix(railURL, "/") + "/submissions"
	audit := func(ctx context.Context) (payoutaudit.Report, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, journal, nil)
		if err != nil {
			return payoutaudit.Report{}, err
		}
		resp, err := d.Do(req)
		if err != nil {
			return payoutaudit.Report{}, fmt.Errorf("read the rail's journal: %w", err)
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(io.LimitReader(resp.Body, maxJournalBytes))
		if err != nil || resp.StatusCode != http.StatusOK {
			return payoutaudit.Report{}, fmt.Errorf("read the rail's journal: status %d: %v", resp.StatusCode, err)
		}
		var list railstub.SubmissionList
		if err := json.Unmarshal(raw, &list); err != nil {
			return payoutaudit.Report{}, fmt.Errorf("decode the rail's journal: %w", err)
		}
		return payoutaudit.Run(ctx, paydb, raildb, list.Submissions, nil)
	}
	return audit, func() { paydb.Close(); raildb.Close() }, nil
}
