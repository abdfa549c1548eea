package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	railapi "github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railstub"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

// PayAgainAtRail submits the first posted payout of st (by payout id) to
// the rail-stub a second time, straight past rail-proxy, as a worker past
// every fence would: the rail's journal then holds two payments of it
// against one debit. It is a Config.Break for the tests of the checks,
// which must fail on it (the soak's own, and the end-to-end benchmark's).
// It returns the payout's id, or paydb's or the rail's error.
func PayAgainAtRail(ctx context.Context, st *stack.Stack) (string, error) {
	paydb, err := pgxpool.New(ctx, st.PayDBURL())
	if err != nil {
		return "", err
	}
	defer paydb.Close()
	var sub railstub.SubmitRequest
	if err := paydb.QueryRow(ctx, `SELECT payout_id, account_id, amount_minor, currency FROM payout WHERE state = 'posted' ORDER BY payout_id LIMIT 1`).
		Scan(&sub.PayoutID, &sub.AccountID, &sub.AmountMinor, &sub.Currency); err != nil {
		return "", err
	}
	sub.Reference = sub.PayoutID
	body, err := json.Marshal(sub)
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, st.RailStubURL()+railapi.RailPathSubmit, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("soak: second submission of %s: %s", sub.PayoutID, resp.Status)
	}
	return sub.PayoutID, nil
}
