package executor_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/executor"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/paymentresource/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/payoutevent"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/fuzztest"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/jsonhandler"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/store/memstore"
)

// healthyDeps is payment-resource and rail-proxy in good health: payout
// p-1 (the event's) goes through as fakeDeps scripts it (claim, rail ACK,
// result; a claim with other terms is refused); any other payout is
// unknown, its claim answered 404 PAYOUT_NOT_FOUND as payment-resource
// answers it.
type healthyDeps struct{ *fakeDeps }

func (d healthyDeps) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, api.PathPayouts+"/") && !strings.HasPrefix(r.URL.Path, api.PayoutPath("p-1")+"/") {
		jsonhandler.WriteError(w, http.StatusNotFound, string(api.CodePayoutNotFound), "no such payout", false)
		return
	}
	d.fakeDeps.ServeHTTP(w, r)
}

// writes counts the calls that changed a dependency's state: the claims
// accepted, the rail submissions, the results and the marks.
func (d healthyDeps) writes() int {
	n := d.railCalls()
	d.mu.Lock()
	defer d.mu.Unlock()
	return n + d.claimed + len(d.results) + len(d.attentions)
}

// fuzzExecutor is an Executor over a real lock-server (memstore) and
// deps, as newExecutor builds one, for a fuzz target.
func fuzzExecutor(f *testing.F, deps http.Handler) (*executor.Executor, *memstore.Store) {
	store := memstore.New(nil)
	ls, err := lockserver.NewServer(store, lockserver.DefaultServerConfig(), slog.New(slog.DiscardHandler))
	if err != nil {
		f.Fatal(err)
	}
	lsrv := httptest.NewServer(ls)
	f.Cleanup(lsrv.Close)
	dsrv := httptest.NewServer(deps)
	f.Cleanup(dsrv.Close)
	cfg := executor.DefaultConfig()
	cfg.LockServerURL, cfg.PaymentResourceURL, cfg.RailProxyURL = lsrv.URL, dsrv.URL, dsrv.URL
	cfg.Owner, cfg.LeaseTTL, cfg.AcquireWait = "worker-a", 2*time.Second, 3*time.Second
	x, err := executor.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		f.Fatal(err)
	}
	// Closed from the start: each push's lease is released before
	// ServeHTTP returns, so that a target sees the lock as it is left.
	if err := x.Close(context.Background()); err != nil {
		f.Fatal(err)
	}
	return x, store
}

// FuzzPush posts arbitrary bodies, with an arbitrary method and content
// type (Pub/Sub's push JSON, a CloudEvent in structured or binary mode,
// or anything), to the executor over a real lock-server (memstore) and
// healthy fake dependencies, and checks the answer's properties (package
// fuzztest; healthy dependencies leave no room for a 5xx) and that a
// push refused or dropped wrote nothing anywhere and left no lease held
// (a dropped event may take its account's lock for the claim that is
// refused; it releases it).
func FuzzPush(f *testing.F) {
	deps := healthyDeps{&fakeDeps{railStatus: 200, railBody: `{"status":"ACK","railRef":"rail-000001"}`}}
	x, store := fuzzExecutor(f, deps)
	good, _ := payoutevent.Encode(event, "m-1", "acct-7", 1)
	other, _ := payoutevent.Encode(payoutevent.Event{PayoutID: "p-2", AccountID: "acct-7", AmountMinor: 1, Currency: "EUR"}, "m-2", "acct-7", 0)
	mismatch, _ := payoutevent.Encode(payoutevent.Event{PayoutID: "p-1", AccountID: "acct-8", AmountMinor: 2500, Currency: "EUR"}, "m-3", "acct-8", 0)
	raw := func(data string) []byte {
		b, _ := payoutevent.EncodeRaw([]byte(data), nil, "m-4", "acct-7", 0)
		return b
	}
	for _, s := range []struct {
		method uint8
		ct     string
		body   []byte
	}{
		{0, "application/json", good},
		{0, "application/json", other},
		{0, "application/json", mismatch},
		{0, "application/cloudevents+json", []byte(`{"specversion":"1.0","type":"google.cloud.pubsub.topic.v1.messagePublished","data":` + string(other) + `}`)},
		{0, "application/cloudevents+json", []byte(`{"data":"` + base64.StdEncoding.EncodeToString(other) + `"}`)},
		{0, "application/json", raw(`{"payoutId":"p-2","accountId":"acct-7","amountMinor":1,"currency":"EUR"} trailing`)},
		{0, "application/json", raw(`not json`)},
		{0, "application/json", []byte(`{"message":{"data":"%%%"}}`)},
		{0, "application/json", []byte(`not a push`)},
		{0, "", []byte(``)},
		{0, "text/plain", other},
		{1, "", nil},
		{0, "application/json", bytes.Repeat([]byte("x"), 70<<10)},
	} {
		f.Add(s.method, s.ct, s.body)
	}
	f.Fuzz(func(t *testing.T, method uint8, contentType string, body []byte) {
		req, ok := fuzztest.NewRequest(method, "/", body, "Content-Type", contentType)
		if !ok {
			return
		}
		writes := deps.writes()
		rec := httptest.NewRecorder()
		x.ServeHTTP(rec, req)
		a := fuzztest.FromRecorder(rec)
		if err := fuzztest.Check(a, fuzztest.Options{}, contentType, string(body)); err != nil {
			t.Fatalf("%s %q: %v", req.Method, contentType, err)
		}
		keys := []string{event.LockKey()}
		if _, ev, err := payoutevent.Decode(body); err == nil {
			keys = append(keys, ev.LockKey())
		}
		executed := a.Status == http.StatusOK && !bytes.Contains(a.Body, []byte(executor.OutcomeDropped))
		if !executed && deps.writes() != writes {
			t.Fatalf("push answered %d %s wrote (%d -> %d)", a.Status, a.Body, writes, deps.writes())
		}
		for _, k := range keys {
			if st, _ := store.Inspect(context.Background(), k); st.Lease != nil {
				t.Fatalf("push answered %d %s left %s held: %+v", a.Status, a.Body, k, st.Lease)
			}
		}
	})
}
