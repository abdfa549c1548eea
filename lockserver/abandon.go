package lockserver

// Abandoned grants and shutdown.
//
// A grant is abandoned when the backend made it but its caller can never
// learn of it: the acquire's request ended before lock-server wrote the
// 200 that carries the token (a plain acquire, or the leader of a batch,
// whose backend call was already committed when the request ended), or,
// batched, the caller left while its batch was in flight (Batcher). The
// key would be held by nobody until the lease's TTL ends. The Server
// releases such a grant in the background (releaseAbandoned), conditional
// on its token so that it can end nothing else, the way a holder's
// release through this lock-server is made: handed to the key's parked
// head waiter when the store can, otherwise released and the waiters of
// the key woken. The wait queue releases its own abandoned grants in the
// request (waitqueue.go abandon).
//
// Only a grant whose 200 was not written is released: the handler checks
// the request's context after the grant and before writing, and a request
// that ended there is answered with an error instead of the grant. A
// request that ends after that check may still lose its answer; that
// lease is an orphan until its TTL, as for any acquire whose answer is
// lost on the way.
//
// The releases run on goroutines of the Server that outlive the request;
// Close waits for them.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/overload"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
)

// ErrCloseTimedOut is returned (wrapped) by Server.Close when background
// releases of abandoned grants were still running at the end of its wait.
var ErrCloseTimedOut = errors.New("lockserver: releases of abandoned grants still running at close")

// errClosing is the reason an abandoned grant found after Close began is
// not released.
var errClosing = errors.New("lockserver: the Server is closing; no release started")

// CloseSlack is what Server.Close waits beyond RequestTimeout: every
// release it waits for was started before Close with a deadline of
// RequestTimeout, so a store that keeps its deadlines has answered by
// then; the slack covers the answer's way back.
const CloseSlack = time.Second

// Where an abandoned grant was found: the "where" attribute of
// EventGrantAbandoned and EventAbandonedReleaseFailed.
const (
	// abandonedInBatch: a Batcher member whose caller left while its
	// batch was in flight.
	abandonedInBatch = "batch"
	// abandonedBeforeAnswer: the acquire handler found its request ended
	// after the grant, before writing it.
	abandonedBeforeAnswer = "answer"
)

// Close waits until the releases of abandoned grants this Server started
// in the background (those of a plain acquire or batch leader whose
// request ended before its grant was written, and those the Server's
// Batcher found among its members) have ended, at most
// ServerConfig.RequestTimeout plus CloseSlack, and marks the Server
// closing: an abandoned grant found after that is not released (it is
// logged with EventAbandonedReleaseFailed and expires after its TTL).
//
// Call it once no request is being served (after the HTTP server's
// shutdown has drained its handlers) and before closing the store: the
// releases it waits for use the store. Close does not close the store
// NewServer was given, which stays its caller's to close, once, after
// Close; the Server owns nothing else that needs closing (the Batcher
// holds no resource of its own). Close does not stop ServeHTTP.
//
// Close is idempotent and safe for concurrent use: every call returns the
// first call's result, and only the first waits. The error is nil, or
// wraps ErrCloseTimedOut when releases were still running when the wait
// ended (they go on, each bounded by its own deadline; a lease whose
// release does not finish ends by its TTL).
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.bgMu.Lock()
		s.closing = true
		s.bgMu.Unlock()
		done := make(chan struct{})
		go func() {
			s.bg.Wait()
			close(done)
		}()
		t := time.NewTimer(s.cfg.RequestTimeout + CloseSlack)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			s.closeErr = fmt.Errorf("%w: waited %v", ErrCloseTimedOut, s.cfg.RequestTimeout+CloseSlack)
		}
	})
	return s.closeErr
}

// releaseAbandoned releases l, a grant nobody can hold (where says how it
// was found), on a goroutine of its own that Close waits for, bounded by
// RequestTimeout. reqCtx is the context of the request it was granted
// to: its trace goes with the release (its store span, its log line), not
// its cancellation nor its other values.
func (s *Server) releaseAbandoned(reqCtx context.Context, l store.Lease, where string) {
	ctx := trace.ContextWithSpanContext(context.Background(), trace.SpanContextFromContext(reqCtx))
	s.bgMu.Lock()
	if s.closing {
		s.bgMu.Unlock()
		s.abandonFailed(ctx, l, where, errClosing)
		return
	}
	s.bg.Add(1)
	s.bgMu.Unlock()
	go func() {
		defer s.bg.Done()
		ctx, cancel := context.WithTimeout(overload.MarkFull(ctx), s.cfg.RequestTimeout)
		defer cancel()
		if err := s.releaseAndWake(ctx, store.LeaseRef{Key: l.Key, Owner: l.Owner, Token: l.Token}); err != nil {
			s.abandonFailed(ctx, l, where, err)
			return
		}
		s.countAbandoned("released")
		s.log.InfoContext(ctx, "grant released: its request had ended before the grant was answered", "event", EventGrantAbandoned,
			"key", l.Key, "owner", l.Owner, "token", l.Token, "where", where)
	}()
}

// abandonFailed logs and counts an abandoned grant that was not released.
func (s *Server) abandonFailed(ctx context.Context, l store.Lease, where string, err error) {
	s.countAbandoned("failed")
	s.log.WarnContext(ctx, "releasing a grant whose request had ended failed; it expires after its TTL", "event", EventAbandonedReleaseFailed,
		"key", l.Key, "owner", l.Owner, "token", l.Token, "where", where, "error", err.Error())
}

// countAbandoned counts one abandoned grant with outcome (released,
// failed) in lockserver_abandoned_grants_total.
func (s *Server) countAbandoned(outcome string) {
	if s.abandonedGrants != nil {
		s.abandonedGrants.WithLabelValues(outcome).Inc()
	}
}

// releaseAndWake ends the lease ref as a release answered by this
// lock-server does: handed to the key's parked head waiter in the same
// backend call when the store can (handOff), otherwise released, and on
// success the key's waiters woken. While it runs, the release is in
// flight for the wait queue: a head about to ask parks until it ends. It
// returns the release's answer.
func (s *Server) releaseAndWake(ctx context.Context, ref store.LeaseRef) error {
	released := false
	s.waitq.releaseStarted(ref.Key)
	defer func() { s.waitq.releaseEnded(ref.Key, released) }()
	handed, err := s.handOff(ctx, ref)
	if handed {
		return err
	}
	err = s.store.Release(ctx, ref.Key, ref.Owner, ref.Token)
	s.observe(ctx, err)
	released = err == nil
	return err
}
