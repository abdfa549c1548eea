package lockserver_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver"
	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
)

// TestLockGrantedNamesThePathThatMintedTheToken: each of lock-server's
// three granting paths logs lock_granted with its own grantedBy, so that
// a token in a log line leads to the store statement that minted it: an
// acquire sent alone, two acquires sent in one store call (group grant),
// and a waiter that a release handed the key to.
func TestLockGrantedNamesThePathThatMintedTheToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newGatedStore()
		h, logs := abandonServer(t, s, nil) // batching and handoff on, the defaults
		alone := send(h, waitAcquireTTL(t.Context(), "payout:alone", "alone", 60_000, 0))
		synctest.Wait() // in the store, at the gate
		g1 := send(h, waitAcquireTTL(t.Context(), "payout:g1", "group-1", 60_000, 0))
		g2 := send(h, waitAcquireTTL(t.Context(), "payout:g2", "group-2", 60_000, 0))
		synctest.Wait() // queued behind it
		close(s.gate)
		var held api.Grant
		for _, c := range []<-chan *httptest.ResponseRecorder{alone, g1, g2} {
			rec := <-c
			if rec.Code != http.StatusOK {
				t.Fatalf("acquire: %d %s", rec.Code, rec.Body)
			}
			if held.Token == 0 { // the first: alone's
				if err := json.Unmarshal(rec.Body.Bytes(), &held); err != nil {
					t.Fatal(err)
				}
			}
		}
		waiter := send(h, waitAcquireTTL(t.Context(), "payout:alone", "waiter", 60_000, 30_000))
		synctest.Wait()
		if !h.HeadParked("payout:alone") {
			t.Fatal("the waiter did not park behind the holder")
		}
		releaseGrant(t, h, held)
		if rec := <-waiter; rec.Code != http.StatusOK {
			t.Fatalf("waiter: %d %s", rec.Code, rec.Body)
		}

		want := map[string]string{"alone": lockserver.GrantedByAcquire, "group-1": lockserver.GrantedByGroup, "group-2": lockserver.GrantedByGroup, "waiter": lockserver.GrantedByHandoff}
		got := map[string]any{}
		for _, e := range logs.Events(t, lockserver.EventLockGranted) {
			got[e["owner"].(string)] = e["grantedBy"]
		}
		for owner, by := range want {
			if got[owner] != by {
				t.Errorf("lock_granted of %s: grantedBy %v; want %q (all: %v)", owner, got[owner], by, got)
			}
		}
	})
}
