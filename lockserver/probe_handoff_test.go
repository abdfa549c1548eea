package lockserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// Adversarial orderings around the wait queue's handoff (probe).

// awaitCond polls cond (a condition, not a fixed sleep) for up to 30 s.
func awaitCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitAcquireTTL is waitAcquire with a TTL of ttlMs.
func waitAcquireTTL(ctx context.Context, key, owner string, ttlMs, waitMs int64) *http.Request {
	return lockRequest(ctx, key, api.SuffixAcquire, api.AcquireRequest{Owner: owner, TTLMs: ttlMs, WaitMs: waitMs})
}

// lockRequest is a POST of body, as JSON, to operation op (api.Suffix*)
// of key, on ctx.
func lockRequest(ctx context.Context, key, op string, body any) *http.Request {
	b, _ := json.Marshal(body)
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, api.PathLockPrefix+key+op, bytes.NewReader(b))
	r.Header.Set("Content-Type", "application/json")
	return r
}

func liveLease(t *testing.T, s store.LockStore, key string) *store.Lease {
	t.Helper()
	st, err := s.Inspect(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	return st.Lease
}

// TestProbeRetriedReleaseRacesHandoff: the holder's release is retried
// while the first attempt's handoff is in flight. The retry is a plain
// release (the head is claimed) and wins; the handoff is then refused,
// the first attempt answered as a refused release, and the waiter is
// granted once, by its own ask, above the holder's token.
func TestProbeRetriedReleaseRacesHandoff(t *testing.T) {
	h, store := handoffServer(t)
	const key = "payout:probe-retry"
	_, holder := serve(h, waitAcquire(t.Context(), key, "holder", 0))
	answer := waitFor(context.Background(), h, key, "waiter")
	awaitParked(t, h, key)
	entered, gate := store.holdNext()
	first := make(chan int, 1)
	go func() { first <- releaseAnswer(h, key, "holder", holder.Token) }()
	<-entered
	if code := releaseAnswer(h, key, "holder", holder.Token); code != http.StatusNoContent {
		t.Fatalf("retried release while the handoff is in flight: %d, want 204", code)
	}
	close(gate)
	code := <-first
	if code == http.StatusNoContent || code < 400 || code >= 500 {
		t.Fatalf("first release (its handoff lost to the retry): %d, want a 4xx refusal", code)
	}
	a := <-answer
	if a.status != http.StatusOK || a.grant.Token <= holder.Token {
		t.Fatalf("waiter: %d %+v; want a grant above %d", a.status, a.grant, holder.Token)
	}
	if got := store.handedOff(); len(got) != 0 {
		t.Fatalf("handoffs %+v; want none (the retry released first)", got)
	}
	if l := liveLease(t, store, key); l == nil || l.Owner != "waiter" || l.Token != a.grant.Token {
		t.Fatalf("live lease %+v; want the waiter's token %d", l, a.grant.Token)
	}
}

// TestProbeRevokeRacesHandoff: an operator's revoke lands while a
// release's handoff is in flight. The revoke ends the holder's grant, the
// handoff is refused (nothing granted), and the waiter is granted by its
// own ask.
func TestProbeRevokeRacesHandoff(t *testing.T) {
	h, store := handoffServer(t)
	const key = "payout:probe-revoke"
	_, holder := serve(h, waitAcquire(t.Context(), key, "holder", 0))
	answer := waitFor(context.Background(), h, key, "waiter")
	awaitParked(t, h, key)
	entered, gate := store.holdNext()
	rel := make(chan int, 1)
	go func() { rel <- releaseAnswer(h, key, "holder", holder.Token) }()
	<-entered
	rec := do(h, http.MethodPost, api.PathLockPrefix+key+api.SuffixRevoke, "application/json", `{"reason":"probe"}`)
	if rec.Code != http.StatusOK {
		t.Fatalf("revoke: %d %s", rec.Code, rec.Body)
	}
	close(gate)
	if code := <-rel; code == http.StatusNoContent {
		t.Fatalf("release after the revoke was answered 204; its grant had been revoked")
	}
	a := <-answer
	if a.status != http.StatusOK || a.grant.Token <= holder.Token {
		t.Fatalf("waiter: %d %+v", a.status, a.grant)
	}
	if got := store.handedOff(); len(got) != 0 {
		t.Fatalf("handoffs %+v; want none", got)
	}
}

// TestProbeRenewRacesHandoff: the holder renews while its release's
// handoff is in flight (renewed: the handoff has not applied); once the
// handoff applied, its renewal is refused as stale.
func TestProbeRenewRacesHandoff(t *testing.T) {
	h, store := handoffServer(t)
	const key = "payout:probe-renew"
	_, holder := serve(h, waitAcquire(t.Context(), key, "holder", 0))
	answer := waitFor(context.Background(), h, key, "waiter")
	awaitParked(t, h, key)
	entered, gate := store.holdNext()
	rel := make(chan int, 1)
	go func() { rel <- releaseAnswer(h, key, "holder", holder.Token) }()
	<-entered
	renew := func() int {
		return do(h, http.MethodPost, api.PathLockPrefix+key+api.SuffixRenew, "application/json",
			fmt.Sprintf(`{"owner":"holder","token":%d}`, holder.Token)).Code
	}
	if code := renew(); code != http.StatusOK {
		t.Fatalf("renew before the handoff applied: %d, want 200", code)
	}
	close(gate)
	if code := <-rel; code != http.StatusNoContent {
		t.Fatalf("release: %d", code)
	}
	a := <-answer
	if a.status != http.StatusOK {
		t.Fatalf("waiter: %d", a.status)
	}
	if code := renew(); code != http.StatusConflict {
		t.Fatalf("renew after the handoff: %d, want 409 (stale)", code)
	}
}

// TestProbeWaitEndsWhileHandoffInFlight: the head's wait (not its
// request) runs out while a handoff to it is in flight. Its request is
// alive, so it must be answered the grant, and that grant must be the
// live one; or, if refused, the key must not be left granted to it.
func TestProbeWaitEndsWhileHandoffInFlight(t *testing.T) {
	h, store := handoffServer(t)
	const key = "payout:probe-waitover"
	_, holder := serve(h, waitAcquire(t.Context(), key, "holder", 0))
	answer := make(chan waitAnswer, 1)
	go func() {
		s, g := serve(h, waitAcquire(context.Background(), key, "waiter", 50))
		answer <- waitAnswer{"waiter", s, g}
	}()
	awaitParked(t, h, key)
	entered, gate := store.holdNext()
	rel := make(chan int, 1)
	go func() { rel <- releaseAnswer(h, key, "holder", holder.Token) }()
	<-entered
	// The head's wait has ended: it waits for the handoff's outcome (or,
	// were it not to wait, it has been answered already).
	awaitCond(t, "the head's wait ended with the handoff in flight", func() bool { return h.HeadClaimedAwake(key) || len(answer) > 0 })
	close(gate)
	if code := <-rel; code != http.StatusNoContent {
		t.Fatalf("release: %d", code)
	}
	a := <-answer
	l := liveLease(t, store, key)
	t.Logf("waiter answered %d token %d; live lease %+v", a.status, a.grant.Token, l)
	switch a.status {
	case http.StatusOK:
		if l == nil || l.Owner != "waiter" || l.Token != a.grant.Token {
			t.Fatalf("waiter answered token %d but the live lease is %+v", a.grant.Token, l)
		}
	default:
		if l != nil && l.Owner == "waiter" {
			t.Fatalf("waiter answered %d but keeps the live lease %+v", a.status, l)
		}
	}
}

// unknownAppliedStore hands off for real and then answers ErrUnavailable,
// as a handoff whose answer was lost after it committed.
type unknownAppliedStore struct {
	*handoffStore
	orphan chan store.Lease
}

func (s *unknownAppliedStore) Handoff(ctx context.Context, from store.LeaseRef, to store.AcquireRequest) (store.Lease, error) {
	l, err := s.mem.Handoff(ctx, from, to)
	if err != nil {
		return l, err
	}
	s.orphan <- l
	return store.Lease{}, fmt.Errorf("%w: the answer was lost after the commit", store.ErrUnavailable)
}

// TestProbeUnknownHandoffThatApplied: the handoff committed but its answer
// was lost. The waiter is never answered that grant (nobody knows its
// token); it asks again and, after the orphan's TTL, is granted a new,
// larger token.
func TestProbeUnknownHandoffThatApplied(t *testing.T) {
	store := &unknownAppliedStore{handoffStore: newHandoffStore(), orphan: make(chan store.Lease, 1)}
	cfg := lockserver.DefaultServerConfig()
	cfg.Batching = false
	h := serverWith(t, store, cfg)
	const key = "payout:probe-unknown-applied"
	_, holder := serve(h, waitAcquire(t.Context(), key, "holder", 0))
	answer := make(chan waitAnswer, 1)
	go func() {
		s, g := serve(h, waitAcquireTTL(context.Background(), key, "waiter", api.MinTTLMs, 10_000))
		answer <- waitAnswer{"waiter", s, g}
	}()
	awaitParked(t, h, key)
	if code := releaseAnswer(h, key, "holder", holder.Token); code != http.StatusServiceUnavailable {
		t.Fatalf("release: %d, want 503", code)
	}
	orphan := <-store.orphan
	a := <-answer
	if a.status != http.StatusOK || a.grant.Token <= orphan.Token {
		t.Fatalf("waiter: %d %+v; want a grant above the orphan's token %d, never the orphan itself", a.status, a.grant, orphan.Token)
	}
}

// TestProbeHeldHintAcrossReplicas: waiter-1 is granted on A; waiter-2,
// the next head on A, parks on the held hint (the key held until
// waiter-1's ExpiresAt, 30 s away). waiter-1 releases through B, which A
// cannot see: waiter-2 must notice within WaitPoll, not at the 30 s
// ExpiresAt (its 10 s wait would end first).
func TestProbeHeldHintAcrossReplicas(t *testing.T) {
	shared := newHandoffStore()
	cfg := lockserver.DefaultServerConfig()
	cfg.Batching = false
	cfg.WaitPoll = 20 * time.Millisecond
	a := serverWith(t, shared, cfg)
	b := serverWith(t, shared.mem, cfg)
	const key = "payout:probe-hint"
	w1, second := secondWaiterOnTheHint(t, a, key, 30_000)
	awaitParked(t, a, key) // waiter-2 on the held hint
	releaseGrant(t, b, w1.grant)
	if w2 := <-second; w2.status != http.StatusOK || w2.grant.Token <= w1.grant.Token {
		t.Fatalf("waiter-2: %d %+v; want granted once waiter-1 released through the other replica", w2.status, w2.grant)
	}
}

// secondWaiterOnTheHint sets the scene of the held-hint tests on h: a
// holder of key, waiter-1 (its grant's TTL ttlMs) parked behind it, then
// waiter-2 queued; the holder releases and waiter-1 is granted, which
// leaves waiter-2 the head, on the hint of waiter-1's grant. It returns
// waiter-1's answer and where waiter-2's will come.
func secondWaiterOnTheHint(t *testing.T, h *lockserver.Server, key string, ttlMs int64) (waitAnswer, <-chan waitAnswer) {
	t.Helper()
	_, holder := serve(h, waitAcquire(t.Context(), key, "holder", 0))
	first := make(chan waitAnswer, 1)
	go func() {
		s, g := serve(h, waitAcquireTTL(context.Background(), key, "waiter-1", ttlMs, 10_000))
		first <- waitAnswer{"waiter-1", s, g}
	}()
	awaitParked(t, h, key)
	second := make(chan waitAnswer, 1)
	go func() {
		s, g := serve(h, waitAcquire(context.Background(), key, "waiter-2", 10_000))
		second <- waitAnswer{"waiter-2", s, g}
	}()
	awaitWaiting(t, h, 2)
	releaseGrant(t, h, holder)
	w1 := <-first
	if w1.status != http.StatusOK {
		t.Fatalf("waiter-1: %d", w1.status)
	}
	return w1, second
}

// TestProbeHeldHintHolderCrash: waiter-1 is granted (TTL 500 ms) and
// crashes; waiter-2, parked on the held hint, is granted after the
// lease expires.
func TestProbeHeldHintHolderCrash(t *testing.T) {
	h, _ := handoffServer(t)
	const key = "payout:probe-crash"
	w1, second := secondWaiterOnTheHint(t, h, key, api.MinTTLMs)
	// waiter-1 never releases.
	if w2 := <-second; w2.status != http.StatusOK || w2.grant.Token <= w1.grant.Token {
		t.Fatalf("waiter-2: %d %+v; want granted after waiter-1's lease expired", w2.status, w2.grant)
	}
}

// TestProbeRefusedHandoffAnswersAsAPlainRelease: a bad release answers
// the same status and error code whether a parked waiter made it a
// handoff or not.
func TestProbeRefusedHandoffAnswersAsAPlainRelease(t *testing.T) {
	type answer struct {
		code int
		body string
	}
	run := func(handoff bool) []answer {
		store := newHandoffStore()
		cfg := lockserver.DefaultServerConfig()
		cfg.Batching, cfg.Handoff = false, handoff
		h := serverWith(t, store, cfg)
		const key = "payout:probe-answers"
		_, holder := serve(h, waitAcquire(t.Context(), key, "holder", 0))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := waitFor(ctx, h, key, "waiter")
		awaitParked(t, h, key)
		var out []answer
		for _, bad := range []struct {
			owner string
			token int64
		}{{"holder", holder.Token + 1}, {"holder", holder.Token - 1}, {"intruder", holder.Token}} {
			rec := do(h, http.MethodPost, api.PathLockPrefix+key+api.SuffixRelease, "application/json",
				fmt.Sprintf(`{"owner":%q,"token":%d}`, bad.owner, bad.token))
			var env struct {
				Error struct {
					Code string `json:"code"`
				} `json:"error"`
			}
			_ = json.Unmarshal(rec.Body.Bytes(), &env)
			out = append(out, answer{rec.Code, env.Error.Code})
			awaitParked(t, h, key)
		}
		cancel()
		<-done
		return out
	}
	plain, handed := run(false), run(true)
	if fmt.Sprint(plain) != fmt.Sprint(handed) {
		t.Fatalf("refused releases: plain %v, with handoff %v; want the same answers", plain, handed)
	}
	t.Logf("answers %v", handed)
}

var _ = memstore.New
