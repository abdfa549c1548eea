package railproxy_test

import (
	"cmp"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencewire"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/fencing/fencingtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy"
	"github.com/distributed-lock-lab/distributed-lock-lab/functions/railproxy/api"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/fuzztest"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/overload"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/overload/overloadtest"
	"github.com/distributed-lock-lab/distributed-lock-lab/internal/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// probeReq is one request of the probe tests: token "" sends no token
// header; with a token, lock-server's proof of it on acct-1's lock goes
// with it.
type probeReq struct {
	name, method, path, ct, body, token string
	status                              int
	code                                api.Code
	proof                               string // sent instead of a real proof of token when set
}

func (q probeReq) serve(h http.Handler) *httptest.ResponseRecorder {
	req := httptest.NewRequest(q.method, q.path, strings.NewReader(q.body))
	if q.ct != "" {
		req.Header.Set("Content-Type", q.ct)
	}
	if q.token != "" {
		req.Header.Set(fencewire.HeaderToken, q.token)
		req.Header.Set(fencewire.HeaderProof, cmp.Or(q.proof, fencingtest.Proof("acct-1", 50)))
		req.Header.Set(fencewire.HeaderOwner, "w")
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// snapshotOf reads raildb's rows at dsn through a pool of its own, closed
// before it returns (none is left open on a server the test freezes).
func snapshotOf(t *testing.T, dsn string) fuzztest.Tables {
	t.Helper()
	db, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := fuzztest.Snapshot(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Newcomer probe, at rail-proxy: with raildb
// frozen, a malformed submission was answered 503 UNAVAILABLE, because the
// stall breaker ran before the body was read. Now, while raildb is marked
// stalled, every bad request still gets its own 4xx code (nothing
// recorded, nothing at the rail), and a good one the breaker's fast 503.
func TestBadInputDuringARaildbStallGetsItsOwn4xx(t *testing.T) {
	cluster := pgtest.NewCluster(t)
	if err := cluster.CreateDatabase(t.Context(), "raildb"); err != nil {
		t.Fatal(err)
	}
	r := newRig(t)
	r.dsn = cluster.DSN("raildb")
	clock := overloadtest.NewClock(time.Unix(1_790_000_000, 0))
	p := r.proxy(func(c *railproxy.Config) { c.Now, c.StallAfter = clock.Now, overload.DefaultStallAfter })
	t.Cleanup(func() { _ = cluster.Thaw() }) // before the proxy's Close
	reg := prometheus.NewRegistry()
	reg.MustRegister(railproxy.Collectors()...)
	mustAccept(t, p, "w", body("seed", "acct-1", 100), 5)
	before := snapshotOf(t, r.dsn)
	atRail := len(r.stub.Submissions(""))
	if err := cluster.Freeze(); err != nil {
		t.Fatal(err)
	}
	// A good submission meets the frozen raildb: 503, and raildb marked
	// stalled.
	if rec := submit(p, "w", body("p-1", "acct-1", 100), "50"); rec.Code != http.StatusServiceUnavailable || envelope(t, rec).Code != api.CodeUnavailable {
		t.Fatalf("a submission meeting the frozen raildb: %d %s; want 503 %s", rec.Code, rec.Body, api.CodeUnavailable)
	}
	if overloadtest.Gauge(t, reg, "railproxy_db_stalled") != 1 {
		t.Fatal("raildb is not marked stalled")
	}

	// The clock stands still: no probe is due, so anything admitted to
	// raildb work would be answered 503 by the breaker.
	good := body("p-2", "acct-1", 100)
	js := "application/json"
	for _, q := range []probeReq{
		{"submission: malformed JSON", "POST", api.PathSubmissions, js, `{"payoutId":`, "50", 400, api.CodeInvalidRequest, ""},
		{"submission: unassigned currency", "POST", api.PathSubmissions, js, strings.Replace(good, `"EUR"`, `"ZZZ"`, 1), "50", 400, api.CodeInvalidRequest, ""},
		{"submission: text body", "POST", api.PathSubmissions, "text/plain", good, "50", 415, api.CodeUnsupportedMediaType, ""},
		{"submission: missing token", "POST", api.PathSubmissions, js, good, "", 400, api.CodeInvalidToken, ""},
		{"submission: amount other than the signed one", "POST", api.PathSubmissions, js, strings.Replace(good, `"amountMinor":100`, `"amountMinor":101`, 1), "50", 403, api.CodeInvalidTerms, ""},
		{"submission: query parameter", "POST", api.PathSubmissions + "?dryRun=1", js, good, "50", 400, api.CodeInvalidRequest, ""},
		{"submission: wrong method", "PUT", api.PathSubmissions, js, good, "50", 405, api.CodeMethodNotAllowed, ""},
		{"reconciliation: malformed JSON", "POST", api.PathReconciliations, js, `[`, "50", 400, api.CodeInvalidRequest, ""},
		// The proof's shape is judged before raildb: only its signature
		// needs the attempt's account, which is in raildb.
		{"reconciliation: malformed proof", "POST", api.PathReconciliations, js, `{"payoutId":"p-1"}`, "50", 403, api.CodeUnverifiedToken, "garbage"},
		{"reconciliation: missing proof", "POST", api.PathReconciliations, js, `{"payoutId":"p-1"}`, "50", 403, api.CodeUnverifiedToken, " "},
		{"submission: malformed proof", "POST", api.PathSubmissions, js, good, "50", 403, api.CodeUnverifiedToken, "v1.x"},
		{"high-water: bad account id", "GET", api.HighWaterPath("-x"), "", "", "", 400, api.CodeInvalidRequest, ""},
		{"attempts: unknown query parameter", "GET", api.PathAttempts + "?payout=p-1", "", "", "", 400, api.CodeInvalidRequest, ""},
		{"no such route", "GET", "/v2/rail", "", "", "", 404, api.CodeNotFound, ""},
	} {
		shedBefore := shedLines(t, r)
		rec := q.serve(p)
		if rec.Code != q.status || envelope(t, rec).Code != q.code {
			t.Fatalf("%s while raildb is stalled: %d %s; want %d %s", q.name, rec.Code, rec.Body, q.status, q.code)
		}
		if n := shedLines(t, r) - shedBefore; n != 0 {
			t.Fatalf("%s: reached the breaker", q.name)
		}
	}
	// The breaker still answers a good submission at once.
	rec := submit(p, "w", good, "50")
	if rec.Code != http.StatusServiceUnavailable || envelope(t, rec).Code != api.CodeUnavailable || rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("a good submission while raildb is stalled: %d %s; want 503 %s with Retry-After", rec.Code, rec.Body, api.CodeUnavailable)
	}

	if err := cluster.Thaw(); err != nil {
		t.Fatal(err)
	}
	awaitRaildbFound(t, p, clock, "acct-1")
	after := snapshotOf(t, r.dsn)
	if changed := before.Changed(after); len(changed) > 0 {
		t.Fatalf("the refused requests changed raildb: %v", changed)
	}
	if n := len(r.stub.Submissions("")); n != atRail {
		t.Fatalf("the rail received %d submissions during the stall", n-atRail)
	}
}

// Newcomer probe, at rail-proxy: a query parameter
// on POST /v1/rail/submissions (or on a route that takes none) was
// ignored, and the submission went to the rail. Now it is refused 400
// INVALID_REQUEST, the code GET /v1/rail/attempts gives an unknown
// parameter, before the fence: no attempt, no high-water change, nothing
// at the rail.
func TestQueryParametersOnRoutesThatTakeNoneAreRefused(t *testing.T) {
	r := newRig(t)
	p := r.proxy(nil)
	mustAccept(t, p, "w", body("p-0", "acct-1", 100), 5)
	attempts, atRail := r.attemptRows(), len(r.stub.Submissions(""))
	js := "application/json"
	for _, q := range []probeReq{
		{"submission", "POST", api.PathSubmissions + "?dryRun=1", js, body("p-1", "acct-1", 100), "50", 400, api.CodeInvalidRequest, ""},
		{"submission, malformed query", "POST", api.PathSubmissions + "?a=%zz", js, body("p-1", "acct-1", 100), "50", 400, api.CodeInvalidRequest, ""},
		{"reconciliation", "POST", api.PathReconciliations + "?force=1", js, `{"payoutId":"p-0"}`, "50", 400, api.CodeInvalidRequest, ""},
		{"high-water", "GET", api.HighWaterPath("acct-1") + "?at=1", "", "", "", 400, api.CodeInvalidRequest, ""},
	} {
		if !strings.Contains(q.path, "?") {
			t.Fatalf("%s: no query", q.name)
		}
		rec := q.serve(p)
		if rec.Code != q.status || envelope(t, rec).Code != q.code || !strings.Contains(envelope(t, rec).Message, "query") {
			t.Fatalf("%s: %d %s; want %d %s saying the query was refused", q.name, rec.Code, rec.Body, q.status, q.code)
		}
	}
	if r.attemptRows() != attempts || len(r.stub.Submissions("")) != atRail || highWater(t, p, "acct-1") != 5 {
		t.Fatal("a refused request was recorded, reached the rail or moved the high-water mark")
	}
}
