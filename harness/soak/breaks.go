package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/rail"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

// PayAgainAtRail submits a posted payout of st (the first by payout id
// whose reference the rail takes) to the rail-stub a second time,
// straight past rail-proxy, as a worker past every fence would: the
// rail's journal then holds two payments of it against one debit. A
// posted payout can carry a stop order at the rail (a reconciliation
// that stopped it while its first submission was in flight, which the
// rail then paid): the rail refuses its reference (409
// REFERENCE_STOPPED), and the next posted payout is tried. It is a
// Config.Break for the tests of the checks, which must fail on it (the
// soak's own, and the end-to-end benchmark's). It returns the payout's
// id, or paydb's or the rail's error.
func PayAgainAtRail(ctx context.Context, st *stack.Stack) (string, error) {
	paydb, err := pgxpool.New(ctx, st.PayDBURL())
	if err != nil {
		return "", err
	}
	defer paydb.Close()
	rows, err := paydb.Query(ctx, `SELECT payout_id, account_id, amount_minor, currency FROM payout WHERE state = 'posted' ORDER BY payout_id LIMIT 50`)
	if err != nil {
		return "", err
	}
	subs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (rail.SubmitRequest, error) {
		var sub rail.SubmitRequest
		err := r.Scan(&sub.PayoutID, &sub.AccountID, &sub.AmountMinor, &sub.Currency)
		sub.Reference = sub.PayoutID
		return sub, err
	})
	if err != nil {
		return "", err
	}
	if len(subs) == 0 {
		return "", fmt.Errorf("soak: no posted payout to pay again")
	}
	var last string
	for _, sub := range subs {
		body, err := json.Marshal(sub)
		if err != nil {
			return "", err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, st.RailStubURL()+rail.PathSubmit, bytes.NewReader(body))
		if err != nil {
			return "", err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", err
		}
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			return sub.PayoutID, nil
		case http.StatusConflict: // the reference has a stop order
			last = fmt.Sprintf("%s: %s", sub.PayoutID, resp.Status)
			continue
		default:
			return "", fmt.Errorf("soak: second submission of %s: %s", sub.PayoutID, resp.Status)
		}
	}
	return "", fmt.Errorf("soak: the rail refused a second submission of every posted payout tried (%d; last %s)", len(subs), last)
}
