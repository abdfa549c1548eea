package client_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/api"
)

// lockServer stands in for lock-server in this module's examples and
// tests, which cannot import the real one: it grants, renews, releases,
// revokes and inspects leases on the api's routes, refuses with the api's
// error envelope, and lets an acquire with a wait wait for the key's
// release. It never expires a lease (every lease here outlives its test)
// and checks no input. lockserver/integration tests the SDK against the
// real lock-server.
type lockServer struct {
	mu     sync.Mutex
	last   int64                // the last token granted, of any key
	lastOf map[string]int64     // the last token granted per key
	leases map[string]api.Grant // the live lease per key
	freed  chan struct{}        // closed, and replaced, when a lease ends
}

func newLockServer() *lockServer {
	return &lockServer{lastOf: map[string]int64{}, leases: map[string]api.Grant{}, freed: make(chan struct{})}
}

func (s *lockServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.Path, api.PathLockPrefix)
	if !ok {
		refuse(w, http.StatusNotFound, api.CodeNotFound)
		return
	}
	if r.Method == http.MethodGet {
		s.mu.Lock()
		defer s.mu.Unlock()
		st := api.LockState{Key: rest, LastToken: s.lastOf[rest]}
		if g, ok := s.leases[rest]; ok {
			st.Held, st.Lease = true, &g
		}
		answer(w, st)
		return
	}
	if key, ok := strings.CutSuffix(rest, api.SuffixAcquire); ok {
		var req api.AcquireRequest
		if decode(w, r, &req) {
			s.acquire(w, r, key, req)
		}
		return
	}
	var req api.ReleaseRequest // a renewal's fields, and a revoke's token
	if !decode(w, r, &req) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, op := range []string{api.SuffixRenew, api.SuffixRelease, api.SuffixRevoke} {
		key, ok := strings.CutSuffix(rest, op)
		if !ok {
			continue
		}
		g, live := s.leases[key]
		ours := g.Owner == req.Owner && g.Token == req.Token
		if op == api.SuffixRevoke { // an operator's: any owner, token 0 for any
			ours = req.Token == 0 || g.Token == req.Token
		}
		switch {
		case live && ours:
		case req.Token != 0 && req.Token < s.lastOf[key]:
			refuse(w, http.StatusConflict, api.CodeStaleToken)
			return
		default:
			refuse(w, http.StatusConflict, api.CodeLeaseNotHeld)
			return
		}
		switch op {
		case api.SuffixRenew:
			g.ExpiresAt = time.Now().Add(time.Duration(g.TTLMs) * time.Millisecond)
			s.leases[key] = g
			answer(w, g)
		case api.SuffixRelease:
			s.endLocked(key)
			w.WriteHeader(http.StatusNoContent)
		case api.SuffixRevoke:
			s.endLocked(key)
			answer(w, g)
		}
		return
	}
	refuse(w, http.StatusNotFound, api.CodeNotFound)
}

// acquire grants key, or refuses LOCK_HELD, after waiting up to
// req.WaitMs for the live lease to end.
func (s *lockServer) acquire(w http.ResponseWriter, r *http.Request, key string, req api.AcquireRequest) {
	start := time.Now()
	until := time.NewTimer(time.Duration(req.WaitMs) * time.Millisecond)
	defer until.Stop()
	for {
		s.mu.Lock()
		if _, held := s.leases[key]; !held {
			s.last++
			g := api.Grant{
				Key: key, Owner: req.Owner, Token: s.last, LeaseID: fmt.Sprintf("stand-in-%d", s.last),
				TTLMs: req.TTLMs, ExpiresAt: time.Now().Add(time.Duration(req.TTLMs) * time.Millisecond),
			}
			if req.WaitMs > 0 {
				g.WaitedMs = time.Since(start).Milliseconds()
			}
			s.leases[key], s.lastOf[key] = g, g.Token
			s.mu.Unlock()
			answer(w, g)
			return
		}
		freed := s.freed
		s.mu.Unlock()
		select {
		case <-freed:
		case <-until.C:
			refuse(w, http.StatusConflict, api.CodeLockHeld)
			return
		case <-r.Context().Done():
			return
		}
	}
}

// endLocked removes key's lease and wakes the waiting acquires. s.mu is held.
func (s *lockServer) endLocked(key string) {
	delete(s.leases, key)
	close(s.freed)
	s.freed = make(chan struct{})
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		refuse(w, http.StatusBadRequest, api.CodeInvalidRequest)
		return false
	}
	return true
}

func answer(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func refuse(w http.ResponseWriter, status int, code api.Code) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(api.ErrorEnvelope{Error: api.ErrorBody{Code: code, Message: string(code), Retryable: code.Retryable()}})
}
