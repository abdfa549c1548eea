package paymentresource

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"
)

// Outbox publisher settings.
const (
	// outboxBatch is the most rows one drain pass publishes.
	outboxBatch = 100
	// publishTimeout bounds one Publish call; a broker that takes longer is
	// treated as failed and the row is published again later.
	publishTimeout = 30 * time.Second
	// maxPublishBackoff caps the retry delay after failed publishes (it
	// starts at the poll interval and doubles).
	maxPublishBackoff = 30 * time.Second
	// markTimeout bounds recording, after Close was called, that the
	// broker acknowledged rows: worth finishing, as every row not marked is
	// published again.
	markTimeout = 5 * time.Second
	// outboxLockID is the transaction-scoped advisory lock that lets one
	// instance drain at a time, so that rows are published in id order
	// even with several instances.
	outboxLockID = 0x6f7574626f78 // "outbox"
)

// errMarkFailed: recording a published row failed; the transaction is
// then unusable and no later row is marked in the pass.
var errMarkFailed = errors.New("outbox: mark failed")

// outbox drains unpublished outbox rows through a Publisher.
type outbox struct {
	pool *pgxpool.Pool
	pub  Publisher
	log  *slog.Logger
	poll time.Duration
	// kick wakes run after a payout was created (buffered, capacity 1).
	kick chan struct{}
	// done is closed when run returns.
	done chan struct{}
}

func newOutbox(pool *pgxpool.Pool, pub Publisher, log *slog.Logger, poll time.Duration) *outbox {
	return &outbox{pool: pool, pub: pub, log: log, poll: poll, kick: make(chan struct{}, 1), done: make(chan struct{})}
}

// wake asks run for a drain pass soon, without blocking.
func (o *outbox) wake() {
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

// run drains the outbox until ctx is cancelled (by Service.Close), then
// closes done. It drains at start, when woken, every poll interval, at once
// again after a full batch, and after a failure with a backoff that doubles
// from the poll interval up to maxPublishBackoff.
func (o *outbox) run(ctx context.Context) {
	defer close(o.done)
	backoff := o.poll
	for {
		n, err := o.drain(ctx)
		wait := o.poll
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			o.log.WarnContext(ctx, "outbox drain failed", "event", api.EventOutboxDrainFailed, "error", err.Error(), "retryIn", backoff)
			wait = backoff
			backoff = min(2*backoff, maxPublishBackoff)
		case n == outboxBatch:
			backoff = o.poll
			continue
		default:
			backoff = o.poll
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-o.kick:
			if err == nil {
				t.Stop()
				continue
			}
			// After a failure a create does not cut the backoff short.
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		case <-t.C:
		}
	}
}

type outboxRow struct {
	id          int64
	orderingKey string
	data        []byte
	attrs       map[string]string
}

// drain publishes up to outboxBatch unpublished rows in id order, marking
// each published after the broker acknowledged it, and stops at the first
// failure so that no row overtakes an earlier one. It returns the number of
// rows published; it does nothing while another instance drains.
func (o *outbox) drain(ctx context.Context) (int, error) {
	tx, err := o.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	var mine bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, int64(outboxLockID)).Scan(&mine); err != nil {
		return 0, fmt.Errorf("outbox lock: %w", err)
	}
	if !mine {
		return 0, nil
	}
	rows, err := tx.Query(ctx, `SELECT id, ordering_key, data, attrs FROM outbox WHERE published_at IS NULL ORDER BY id LIMIT $1`, outboxBatch)
	if err != nil {
		return 0, fmt.Errorf("read outbox: %w", err)
	}
	batch, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outboxRow, error) {
		var row outboxRow
		var attrs []byte
		if err := r.Scan(&row.id, &row.orderingKey, &row.data, &attrs); err != nil {
			return row, err
		}
		return row, json.Unmarshal(attrs, &row.attrs)
	})
	if err != nil {
		return 0, fmt.Errorf("read outbox: %w", err)
	}
	// Once the broker has acknowledged a row, recording it is worth
	// finishing even when Close cancels ctx: an unmarked row is published
	// again.
	mark, cancel := context.WithTimeout(context.WithoutCancel(ctx), markTimeout)
	defer cancel()
	published := 0
	var pubErr error
	logPublished := func(pctx context.Context, row outboxRow) {
		o.log.DebugContext(pctx, "outbox row published", "event", api.EventOutboxPublished, "outboxId", row.id, "orderingKey", row.orderingKey,
			"payoutId", row.attrs[payoutevent.AttrPayoutID], "accountId", row.attrs[payoutevent.AttrAccountID])
	}
	markOne := func(row outboxRow, pctx context.Context) error {
		if _, err := tx.Exec(mark, `UPDATE outbox SET published_at = clock_timestamp() WHERE id = $1`, row.id); err != nil {
			return fmt.Errorf("mark outbox row %d: %w", row.id, err)
		}
		published++
		logPublished(pctx, row)
		return nil
	}
	failed := func(pctx context.Context, row outboxRow, err error) error {
		// Logged here, not by run: a failure must be on record even
		// when Close interrupts the pass right after it.
		o.log.WarnContext(pctx, "outbox publish failed", "event", api.EventOutboxPublishFailed, "outboxId", row.id, "orderingKey", row.orderingKey,
			"payoutId", row.attrs[payoutevent.AttrPayoutID], "accountId", row.attrs[payoutevent.AttrAccountID], "error", err.Error())
		return fmt.Errorf("publish outbox row %d (payout %s): %w", row.id, row.attrs[payoutevent.AttrPayoutID], err)
	}
	if ap, ok := o.pub.(AsyncPublisher); ok {
		// Every row of the batch is handed to the broker's client at
		// once, in id order, and the acknowledgements are awaited
		// afterwards: the client bundles them into a few requests
		// instead of one request (and one bundling delay) per row.
		// Order within an ordering key is the client's (it sends a key's
		// messages in call order and fails every later message of a key
		// after a failure); across keys no order is promised. A row is
		// marked only once acknowledged, and no row is marked after an
		// unacknowledged row of the same key, so that the next pass
		// publishes the key's rows again from the first missing one.
		pctx, cancelPub := context.WithTimeout(ctx, publishTimeout)
		defer cancelPub()
		type inFlight struct {
			row  outboxRow
			ctx  context.Context
			span trace.Span
			wait func(context.Context) error
		}
		sent := make([]inFlight, 0, len(batch))
		var acked []inFlight // acknowledged and to be marked
		for _, row := range batch {
			rctx, span, attrs := startPublish(pctx, row.id, row.orderingKey, row.attrs)
			sent = append(sent, inFlight{row: row, ctx: rctx, span: span, wait: ap.PublishAsync(rctx, row.orderingKey, row.data, attrs)})
		}
		stopped := map[string]bool{} // ordering keys with an unacknowledged row
		for _, f := range sent {
			err := f.wait(f.ctx)
			endPublish(f.span, err)
			switch {
			case err != nil:
				stopped[f.row.orderingKey] = true
				pubErr = errors.Join(pubErr, failed(f.ctx, f.row, err))
			case stopped[f.row.orderingKey] || pubErr != nil && errors.Is(pubErr, errMarkFailed):
				// Acknowledged after an earlier row of its key was not (or
				// after a mark failed): published again next pass, a
				// duplicate the pipeline absorbs.
			default:
				acked = append(acked, f)
			}
		}
		// Every acknowledged row marked by one statement: the marks only
		// count at the commit below, all or none, as they did one
		// statement per row.
		ids := make([]int64, len(acked))
		for i, f := range acked {
			ids[i] = f.row.id
		}
		if len(ids) > 0 {
			if _, err := tx.Exec(mark, `UPDATE outbox SET published_at = clock_timestamp() WHERE id = ANY($1)`, ids); err != nil {
				pubErr = errors.Join(pubErr, fmt.Errorf("%w: mark %d outbox rows: %w", errMarkFailed, len(ids), err))
			} else {
				for _, f := range acked {
					published++
					logPublished(f.ctx, f.row)
				}
			}
		}
	} else {
		for _, row := range batch {
			pctx, cancelPub := context.WithTimeout(ctx, publishTimeout)
			pctx, span, attrs := startPublish(pctx, row.id, row.orderingKey, row.attrs)
			err := o.pub.Publish(pctx, row.orderingKey, row.data, attrs)
			endPublish(span, err)
			if err != nil {
				pubErr = failed(pctx, row, err)
				cancelPub()
				break
			}
			err = markOne(row, pctx)
			cancelPub()
			if err != nil {
				pubErr = err
				break
			}
		}
	}
	if err := tx.Commit(mark); err != nil {
		return 0, errors.Join(pubErr, fmt.Errorf("commit outbox marks: %w", err))
	}
	return published, pubErr
}
