package lockserver

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// Defaults and bounds of BatchConfig.
const (
	// DefaultBatchMaxSize is the most members one backend round trip
	// carries. 64: the concurrency one lock-server sees under load, and
	// under etcd's default limit of 128 operations per transaction (a
	// grant is one nested transaction, counted with its operations).
	DefaultBatchMaxSize = 64
	// MaxBatchMaxSize caps BatchConfig.MaxSize: one PostgreSQL statement
	// with thousands of rows holds every one of their row locks until it
	// ends.
	MaxBatchMaxSize = 1024
	// MaxBatchWindow caps BatchConfig.Window: every request that starts a
	// batch waits that long before its round trip.
	MaxBatchWindow = 100 * time.Millisecond
)

// BatchConfig configures a Batcher. Start from DefaultBatchConfig.
type BatchConfig struct {
	// MaxSize is the most members of one backend call; more waiting
	// requests go in the next one. Default DefaultBatchMaxSize; 1 to
	// MaxBatchMaxSize (1 sends every request alone, in arrival order).
	MaxSize int
	// Window is how long a request that finds no batch in flight waits for
	// others before it is sent. Default 0: a request is sent at once, and
	// requests coalesce only while a batch is in flight (group commit), so
	// a lone client pays nothing. At most MaxBatchWindow.
	Window time.Duration
	// Timeout bounds one batch's backend call when a member's context has
	// no deadline; otherwise the call runs until the latest deadline of
	// its members. Default 5s (lock-server's request timeout). Positive.
	Timeout time.Duration
}

// DefaultBatchConfig returns the defaults documented on BatchConfig.
func DefaultBatchConfig() BatchConfig {
	return BatchConfig{MaxSize: DefaultBatchMaxSize, Timeout: 5 * time.Second}
}

// Validate returns nil or one error per invalid field, joined.
func (c BatchConfig) Validate() error {
	var errs []error
	if c.MaxSize < 1 || c.MaxSize > MaxBatchMaxSize {
		errs = append(errs, fmt.Errorf("lockserver: batch MaxSize must be 1 to %d, got %d", MaxBatchMaxSize, c.MaxSize))
	}
	if c.Window < 0 || c.Window > MaxBatchWindow {
		errs = append(errs, fmt.Errorf("lockserver: batch Window must be 0 to %v, got %v", MaxBatchWindow, c.Window))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("lockserver: batch Timeout must be positive, got %v", c.Timeout))
	}
	return errors.Join(errs...)
}

// Batcher is a LockStore that coalesces concurrent Acquire, Release and
// Renew calls into one call of the wrapped store's BatchStore (and
// BatchRenewer) methods: one backend round trip for many keys. Revoke,
// Inspect, Ping and Close go straight to the store, as do the calls a
// store without the capability cannot batch.
//
// How a call is served. Each operation has a queue. A call that finds no
// batch of its operation in flight becomes the leader: after
// BatchConfig.Window it takes the waiting calls (itself first, at most
// MaxSize), makes the store call on its own goroutine, answers every
// member, and hands the lead to the first call still waiting, if any.
// Calls that arrive meanwhile wait for that next batch. A batch of one
// member uses the store's single call, so a lone client sees the store's
// ordinary path. There is no goroutine of the Batcher's own: every batch
// runs on the goroutine of one of its members, and Close has nothing to
// wait for, but for the releases of abandoned grants (Contexts, below).
//
// Duplicate keys. A backend statement may touch a key once, so one batch
// holds at most one call per key; of calls for the same key, the first in
// arrival order is sent. For acquires, the others are answered from its
// outcome: if it was granted or refused as held, they are refused with
// ErrLockHeld (they overlapped the first in time, so the history in which
// the first took effect, then they were refused, is a correct one); on any
// other outcome they wait for the next batch. Releases and renewals of a
// repeated key always wait for the next batch: each carries its own token
// and owner, and is judged against the key as the previous one left it.
//
// Contexts. A call whose context ends while it waits (in the queue, or in
// its batching window as a leader) leaves the queue and returns an error
// wrapping ErrUnavailable (nothing was sent for it). One that ends while
// its batch is in flight returns at once with the same error, and the
// outcome is unknown to its caller, as for a single call that times out.
// The Batcher learns it when the batch answers: an acquire granted to a
// caller that has gone is abandoned, and the Batcher releases it at once
// (the store's Release with the grant's own token, so it can end nothing
// else, on a goroutine of its own that Close waits for), instead of
// leaving the key held by nobody until the lease's TTL ends; if that
// release fails, the lease expires after its TTL. A Server's Batcher
// hands such a grant to the Server instead (NewServer), which releases
// it the way a holder's release is made (waking the key's waiters) and
// which Server.Close waits for.
// A batch of several runs on a context that keeps the leader's values but
// not its cancellation, until the latest deadline of its members; a batch
// of one runs on its request's own context.
type Batcher struct {
	store store.LockStore
	cfg   BatchConfig

	acq *lane[store.AcquireRequest, store.Result]
	rel *lane[store.LeaseRef, error]
	ren *lane[store.LeaseRef, store.Result]

	// The releases of abandoned grants in flight (Close waits for them),
	// and how many were released.
	abandoning sync.WaitGroup
	abandoned  atomic.Uint64
	// closing is set by Close, under abandonMu; no release starts after
	// it, so that none is added to abandoning while Close waits.
	abandonMu sync.Mutex
	closing   bool
	// onAbandon, when not nil, is given every abandoned grant instead of
	// releaseAbandoned, with the context of the call it was granted to
	// (ended): the owner of the hook releases it. Set by NewServer
	// before the Batcher serves any call.
	onAbandon func(ctx context.Context, l store.Lease)
	// onGrant, when not nil, is given the token of every grant a batch
	// returned, before any member is answered and before the lead passes
	// to the next batch: the Server's token floor (floor.go), which the
	// next batch reads as it is sent, so must already hold these tokens.
	// Set by NewServer before the Batcher serves any call.
	onGrant func(token int64)
}

var _ store.LockStore = (*Batcher)(nil)

// NewBatcher returns a Batcher over store. If store implements neither
// BatchStore nor BatchRenewer, every call goes straight to it. It returns
// an error if cfg is invalid or store is nil.
func NewBatcher(lockStore store.LockStore, cfg BatchConfig) (*Batcher, error) {
	if lockStore == nil {
		return nil, errors.New("lockserver: NewBatcher needs a store")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	b := &Batcher{store: lockStore, cfg: cfg}
	if bs, ok := lockStore.(store.BatchStore); ok {
		b.acq = &lane[store.AcquireRequest, store.Result]{
			cfg: cfg, op: "acquire",
			key: func(r store.AcquireRequest) string { return r.Key },
			one: func(ctx context.Context, r store.AcquireRequest) store.Result {
				l, err := lockStore.Acquire(ctx, r.Key, r.Owner, r.TTL)
				return store.Result{Lease: l, Err: err}
			},
			many: bs.AcquireMany,
			dup: func(r store.AcquireRequest, first store.Result) (store.Result, bool) {
				if first.Err == nil || errors.Is(first.Err, store.ErrLockHeld) {
					return store.Result{Err: fmt.Errorf("%w: key %q was decided by another acquire in the same batch, which found it free and took it or found it held", store.ErrLockHeld, r.Key)}, true
				}
				return store.Result{}, false
			},
			fail: func(err error) store.Result { return store.Result{Err: err} },
			settled: func(r store.Result) {
				if r.Err == nil && b.onGrant != nil {
					b.onGrant(r.Lease.Token)
				}
			},
			abandon: func(ctx context.Context, _ store.AcquireRequest, r store.Result) {
				switch {
				case r.Err != nil:
				case b.onAbandon != nil:
					b.onAbandon(ctx, r.Lease)
				default:
					b.releaseAbandoned(r.Lease)
				}
			},
		}
		b.rel = &lane[store.LeaseRef, error]{
			cfg: cfg, op: "release",
			key: func(r store.LeaseRef) string { return r.Key },
			one: func(ctx context.Context, r store.LeaseRef) error {
				return lockStore.Release(ctx, r.Key, r.Owner, r.Token)
			},
			many: bs.ReleaseMany,
			fail: func(err error) error { return err },
		}
	}
	if br, ok := lockStore.(store.BatchRenewer); ok {
		b.ren = &lane[store.LeaseRef, store.Result]{
			cfg: cfg, op: "renew",
			key: func(r store.LeaseRef) string { return r.Key },
			one: func(ctx context.Context, r store.LeaseRef) store.Result {
				l, err := lockStore.Renew(ctx, r.Key, r.Owner, r.Token)
				return store.Result{Lease: l, Err: err}
			},
			many: br.RenewMany,
			fail: func(err error) store.Result { return store.Result{Err: err} },
		}
	}
	return b, nil
}

// Unwrap returns the store the Batcher wraps.
func (b *Batcher) Unwrap() store.LockStore { return b.store }

// BatchStats counts the store calls of one operation a Batcher made and
// the requests they carried; Requests/Calls is the mean batch size.
type BatchStats struct {
	// Calls is the number of store calls made (a batch of one counts).
	Calls uint64
	// Requests is the number of requests those calls answered, duplicates
	// answered from another member's outcome included.
	Requests uint64
}

// Stats returns the counts of acquire, release and renew batches; zero for
// an operation the store cannot batch.
func (b *Batcher) Stats() (acquire, release, renew BatchStats) {
	return b.acq.stats(), b.rel.stats(), b.ren.stats()
}

// Acquire implements LockStore, batched when the store is a BatchStore.
func (b *Batcher) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (store.Lease, error) {
	if b.acq == nil {
		return b.store.Acquire(ctx, key, owner, ttl)
	}
	r := b.acq.do(ctx, store.AcquireRequest{Key: key, Owner: owner, TTL: ttl})
	return r.Lease, r.Err
}

// Renew implements LockStore, batched when the store is a BatchRenewer.
func (b *Batcher) Renew(ctx context.Context, key, owner string, token int64) (store.Lease, error) {
	if b.ren == nil {
		return b.store.Renew(ctx, key, owner, token)
	}
	r := b.ren.do(ctx, store.LeaseRef{Key: key, Owner: owner, Token: token})
	return r.Lease, r.Err
}

// Release implements LockStore, batched when the store is a BatchStore.
func (b *Batcher) Release(ctx context.Context, key, owner string, token int64) error {
	if b.rel == nil {
		return b.store.Release(ctx, key, owner, token)
	}
	return b.rel.do(ctx, store.LeaseRef{Key: key, Owner: owner, Token: token})
}

// Revoke implements LockStore; never batched.
func (b *Batcher) Revoke(ctx context.Context, key string, token int64) (store.Lease, error) {
	return b.store.Revoke(ctx, key, token)
}

// Inspect implements LockStore; never batched.
func (b *Batcher) Inspect(ctx context.Context, key string) (store.State, error) {
	return b.store.Inspect(ctx, key)
}

// Ping implements LockStore.
func (b *Batcher) Ping(ctx context.Context) error { return b.store.Ping(ctx) }

// Close implements LockStore: it waits for the releases of abandoned
// grants in flight, then closes the store. Calls in flight end with the
// store's answer; a grant they make for a caller that has gone is not
// released once Close has begun (its lease ends after its TTL).
func (b *Batcher) Close() error {
	b.abandonMu.Lock()
	b.closing = true
	b.abandonMu.Unlock()
	b.abandoning.Wait()
	return b.store.Close()
}

// Abandoned returns the number of grants the Batcher released because
// their caller had gone while their batch was in flight; a Server's
// Batcher leaves those releases to the Server and counts none.
func (b *Batcher) Abandoned() uint64 { return b.abandoned.Load() }

// releaseAbandoned releases l, granted to a caller that has gone, on a
// goroutine of its own, bounded by BatchConfig.Timeout.
func (b *Batcher) releaseAbandoned(l store.Lease) {
	b.abandonMu.Lock()
	defer b.abandonMu.Unlock()
	if b.closing {
		return
	}
	b.abandoning.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), b.cfg.Timeout)
		defer cancel()
		if b.store.Release(ctx, l.Key, l.Owner, l.Token) == nil {
			b.abandoned.Add(1)
		}
	})
}

// lane is the queue of one operation: requests Q answered with R.
type lane[Q, R any] struct {
	cfg  BatchConfig
	op   string
	key  func(Q) string
	one  func(context.Context, Q) R     // the single call, for a batch of one
	many func(context.Context, []Q) []R // the batched call
	// dup answers a request whose key was sent in the same batch by
	// another, from that one's result; false: it waits for the next batch.
	// Nil: always the next batch.
	dup  func(q Q, first R) (R, bool)
	fail func(error) R // the answer to a call whose context ended
	// settled, when not nil, is given every result of a batch before any
	// member is answered and before the lead is handed on.
	settled func(R)
	// abandon, when not nil, is given the result of every member of a
	// batch whose caller had gone when the batch answered, with that
	// member's (ended) context.
	abandon func(ctx context.Context, q Q, r R)

	calls, requests atomic.Uint64

	mu      sync.Mutex
	busy    bool          // a leader exists (running, or handed the lead)
	pending []*call[Q, R] // waiting, in arrival order
}

// call is one request in a lane.
type call[Q, R any] struct {
	ctx  context.Context
	req  Q
	res  R
	done chan struct{} // closed once res is set
	lead chan struct{} // receives the lead (buffered)

	// Guarded by the lane's mu.
	leader bool // handed the lead, not yet running
	taken  bool // in a batch in flight, or answered
	gone   bool // its caller returned while taken: never queue it again
}

func (l *lane[Q, R]) stats() BatchStats {
	if l == nil {
		return BatchStats{}
	}
	return BatchStats{Calls: l.calls.Load(), Requests: l.requests.Load()}
}

// do queues q and returns its answer.
func (l *lane[Q, R]) do(ctx context.Context, q Q) R {
	c := &call[Q, R]{ctx: ctx, req: q, done: make(chan struct{}), lead: make(chan struct{}, 1)}
	l.mu.Lock()
	l.pending = append(l.pending, c)
	if !l.busy {
		// Nothing in flight: this call leads. Only now can a window help.
		l.busy = true
		l.mu.Unlock()
		if l.cfg.Window > 0 {
			t := time.NewTimer(l.cfg.Window)
			select {
			case <-t.C:
			case <-ctx.Done():
				// Nothing was sent for it: it leaves, and the calls that
				// joined it in the window get the lead.
				t.Stop()
				l.mu.Lock()
				l.remove(c)
				l.handOff()
				l.mu.Unlock()
				return l.fail(l.gaveUp(q, ctx.Err(), "before it was sent; nothing was done"))
			}
		}
		l.run()
		return c.res
	}
	l.mu.Unlock()
	select {
	case <-c.done:
		return c.res
	case <-c.lead:
		l.run()
		return c.res
	case <-ctx.Done():
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.taken {
		select {
		case <-c.done:
			return c.res
		default:
		}
		// A repeat of a key is taken without being sent, and may be put
		// back in the queue (run): it must not be, now that nobody waits
		// for it to take the lead.
		c.gone = true
		return l.fail(l.gaveUp(q, ctx.Err(), "while its batch was in flight; the outcome is unknown"))
	}
	l.remove(c)
	if c.leader {
		l.handOff()
	}
	return l.fail(l.gaveUp(q, ctx.Err(), "before it was sent; nothing was done"))
}

func (l *lane[Q, R]) gaveUp(q Q, err error, when string) error {
	return fmt.Errorf("%w: lockserver: batched %s of key %q: context ended %s: %w", store.ErrUnavailable, l.op, l.key(q), when, err)
}

// remove takes c out of pending; l.mu is held.
func (l *lane[Q, R]) remove(c *call[Q, R]) {
	for i, p := range l.pending {
		if p == c {
			l.pending = append(l.pending[:i], l.pending[i+1:]...)
			return
		}
	}
}

// handOff gives the lead to the first waiting call, or ends the lane's
// busy state when none waits; l.mu is held.
func (l *lane[Q, R]) handOff() {
	if len(l.pending) == 0 {
		l.busy = false
		return
	}
	next := l.pending[0]
	next.leader = true
	next.lead <- struct{}{} // buffered, and sent once per call
}

// run is the leader's work: take a batch, call the store, answer every
// member, hand the lead on.
func (l *lane[Q, R]) run() {
	l.mu.Lock()
	var (
		batch []*call[Q, R]
		dups  = map[int][]*call[Q, R]{} // by index in batch
		index = map[string]int{}
		rest  = l.pending[:0:0]
	)
	for _, c := range l.pending {
		k := l.key(c.req)
		if i, ok := index[k]; ok {
			if l.dup != nil {
				dups[i] = append(dups[i], c)
				c.taken = true
				continue
			}
		} else if len(batch) < l.cfg.MaxSize {
			index[k] = len(batch)
			batch = append(batch, c)
			c.taken, c.leader = true, false
			continue
		}
		rest = append(rest, c)
	}
	l.pending = rest
	l.mu.Unlock()

	for _, c := range batch {
		noteSent(c.ctx, len(batch))
	}
	if len(batch) > 0 { // empty only if every waiting call left
		res, err := l.call(batch)
		if err == nil && len(res) != len(batch) {
			err = fmt.Errorf("lockserver: batched %s: the store answered %d of %d members", l.op, len(res), len(batch))
		}
		if err != nil { // a store bug: answer every member with it
			res = make([]R, len(batch))
			for i := range res {
				res[i] = l.fail(err)
			}
		}
		l.calls.Add(1)
		if l.settled != nil {
			for _, r := range res {
				l.settled(r)
			}
		}
		for i, c := range batch {
			c.res = res[i]
			close(c.done)
		}
		if l.abandon != nil {
			// A member whose caller returned while the batch was in flight
			// (gone, set under l.mu only while done was open) was told the
			// outcome is unknown: nobody will learn this result.
			l.mu.Lock()
			var gone []int
			for i, c := range batch {
				if c.gone {
					gone = append(gone, i)
				}
			}
			l.mu.Unlock()
			for _, i := range gone {
				l.abandon(batch[i].ctx, batch[i].req, res[i])
			}
		}
		answered := len(batch)
		var again []*call[Q, R]
		for i, cs := range dups {
			for _, c := range cs {
				r, ok := l.dup(c.req, res[i])
				if !ok && c.ctx.Err() != nil {
					// Its caller has gone (it was told the outcome is
					// unknown): never send it.
					r, ok = l.fail(l.gaveUp(c.req, c.ctx.Err(), "before it was sent; nothing was done")), true
				}
				if !ok {
					again = append(again, c)
					continue
				}
				c.res = r
				close(c.done)
				answered++
			}
		}
		l.requests.Add(uint64(answered))
		if len(again) > 0 {
			l.mu.Lock()
			back := again[:0]
			for _, c := range again {
				if c.gone { // its caller left after the check above
					continue
				}
				c.taken = false
				back = append(back, c)
			}
			l.pending = append(back, l.pending...)
			l.mu.Unlock()
		}
	}
	l.mu.Lock()
	l.handOff()
	l.mu.Unlock()
}

// call makes the store call for batch. A panic in the store is returned as
// an error, so that the members are answered and the lane handed on
// instead of every later request waiting for a leader that is gone.
func (l *lane[Q, R]) call(batch []*call[Q, R]) (res []R, err error) {
	defer func() {
		if p := recover(); p != nil {
			res, err = nil, fmt.Errorf("lockserver: batched %s of %d requests: the store panicked: %v", l.op, len(batch), p)
		}
	}()
	if len(batch) == 1 {
		// Alone: the store's single call on the request's own context,
		// exactly as without batching.
		return []R{l.one(batch[0].ctx, batch[0].req)}, nil
	}
	ctx, cancel := l.batchContext(batch)
	defer cancel()
	reqs := make([]Q, len(batch))
	for i, c := range batch {
		reqs[i] = c.req
	}
	return l.many(ctx, reqs), nil
}

// batchContext is the context of one batch's store call: the leader's
// values without its cancellation, until the latest deadline of the
// members (or Timeout from now when one has none).
func (l *lane[Q, R]) batchContext(batch []*call[Q, R]) (context.Context, context.CancelFunc) {
	latest, all := time.Time{}, true
	for _, c := range batch {
		d, ok := c.ctx.Deadline()
		if !ok {
			all = false
			break
		}
		if d.After(latest) {
			latest = d
		}
	}
	base := context.WithoutCancel(batch[0].ctx)
	if !all {
		return context.WithTimeout(base, l.cfg.Timeout)
	}
	return context.WithDeadline(base, latest)
}

// sendNoteKey is the context key of withSendNote.
type sendNoteKey struct{}

// withSendNote returns ctx carrying note, which a Batcher calls on the
// leader's goroutine just before it sends the request of ctx to the store
// (alone or in a batch), after any wait in its queue, with the number of
// requests the store call carries (1: the store's single call). The
// Server reads its token floor again there (floor.go): a grant sent after
// another grant's answer came back must get a larger token, and a request
// that waited behind a batch in flight was sent after that batch's
// answers. It also learns there whether its grant is a group grant.
func withSendNote(ctx context.Context, note func(members int)) context.Context {
	return context.WithValue(ctx, sendNoteKey{}, note)
}

// noteSent calls the note of ctx (withSendNote), if any.
func noteSent(ctx context.Context, members int) {
	if note, ok := ctx.Value(sendNoteKey{}).(func(int)); ok {
		note(members)
	}
}
