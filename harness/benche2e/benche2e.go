// Package benche2e is the end-to-end benchmark of the payout pipeline:
// each run is a soak run without chaos (harness/soak) on a fresh local
// stack, measured through the soak's Observe hook (Observer: payouts/s,
// latency, deliveries, CPU per payout, optional profiles, statement
// counts and etcd's requests) and failed by any broken integrity check. Run it with
// `make bench-e2e` or ./harness/cmd/benche2e; docs/benchmarks.md has the
// method and the figures.
package benche2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/httpmetrics"
	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

// Measurement is what Observer measured over one run.
type Measurement struct {
	// Payouts counts the payouts posted during the run.
	Payouts int `json:"payouts"`
	// Seconds is the time from the first payout created to the last
	// posted (paydb's clock).
	Seconds float64 `json:"seconds"`
	// PayoutsPerSecond is Payouts / Seconds.
	PayoutsPerSecond float64 `json:"payoutsPerSecond"`
	// LatencyMs holds the created-to-posted latency percentiles, in
	// milliseconds: "p50", "p95", "p99", "max".
	LatencyMs map[string]float64 `json:"latencyMs"`
	// OutboxLagMs holds the percentiles of the wait of each payout's
	// event in payment-resource's outbox, from the row's creation to the
	// broker's acknowledgement (outbox created_at to published_at), in
	// milliseconds: the first thing every payout waits on.
	OutboxLagMs map[string]float64 `json:"outboxLagMs"`
	// Deliveries counts the push requests each executor answered during
	// the run, by executor name (A, B, ...).
	Deliveries map[string]int `json:"deliveries"`
	// CPUSeconds is the CPU time (user + system) each process used during
	// the run, by process name (lock-server, executor-A, postgres-paydb
	// with its backends, "bench" for this process: the creators and the
	// push bridges).
	CPUSeconds map[string]float64 `json:"cpuSeconds"`
	// CPUPerPayoutMs is CPUSeconds per posted payout, in milliseconds,
	// with "total" for the sum.
	CPUPerPayoutMs map[string]float64 `json:"cpuPerPayoutMs"`
	// Profiles are the CPU profiles taken during the run, by process
	// name (files in the run folder), with Config.ProfileSeconds.
	Profiles map[string]string `json:"profiles,omitempty"`
	// Statements are the statements the stack's databases served during
	// the run, with ObserverConfig.Statements (stack.Stack.StatementStats,
	// reset as the load starts), by cluster, database and calls.
	Statements []stack.StatementStat `json:"statements,omitempty"`
	// StatementsPerPayout is, by database, the statements it served per
	// posted payout during the run (its round trips: BEGIN and COMMIT
	// count, a pgx.Batch counts each statement), with "total" for their
	// sum. With ObserverConfig.Statements.
	StatementsPerPayout map[string]float64 `json:"statementsPerPayout,omitempty"`
	// EtcdPerPayout is, with ObserverConfig.Statements and the etcd
	// backend, what etcd served per posted payout during the run, from
	// etcd's own metrics (etcd.go): "grpc METHOD" the gRPC requests by
	// method ("grpc Txn", "grpc LeaseKeepAlive", ...) and "grpc total"
	// their sum, summed over the members; "Txn read-only" the
	// transactions among them answered without a raft proposal; then the
	// leader's "keys put", "keys deleted", "leases expired", "proposals
	// committed", "WAL fsyncs" and "backend commits".
	EtcdPerPayout map[string]float64 `json:"etcdPerPayout,omitempty"`
	// RequestsPerPayout is, by service and route ("payment-resource
	// /v1/payouts/{id}/claim", "lock-server acquire", ...), the HTTP
	// requests it answered per posted payout during the run (its
	// function_requests_total or lockserver_requests_total series; the
	// executors' under "executor"), with "total" for their sum. Exact
	// counts, unlike CPU.
	RequestsPerPayout map[string]float64 `json:"requestsPerPayout,omitempty"`
	// LoadBefore and LoadAfter are the 1-minute load average of the
	// machine (/proc/loadavg) when the run started and ended.
	LoadBefore float64 `json:"loadBefore"`
	LoadAfter  float64 `json:"loadAfter"`
}

// ObserverConfig says what Observer measures besides the defaults.
type ObserverConfig struct {
	// ProfileSeconds > 0 takes a CPU profile of that many seconds from
	// every service process as the load starts (the stack must run with
	// Pprof), written to ProfileDir/NAME.pprof.
	ProfileSeconds int
	ProfileDir     string
	// Statements reads the statement statistics of the stack's databases
	// (the stack must run with StatementStats): reset as the load starts,
	// read when the run has settled; with the etcd backend, etcd's metrics
	// too (Measurement.EtcdPerPayout).
	Statements bool
}

// Observer returns a soak.Config.Observe hook that fills m, with what cfg
// adds. Its end fails with the first error of a profile, of the
// statement statistics or of etcd's metrics.
func Observer(m *Measurement, cfg ObserverConfig) func(ctx context.Context, st *stack.Stack) (func(context.Context) error, error) {
	profileSeconds, dir := cfg.ProfileSeconds, cfg.ProfileDir
	return func(ctx context.Context, st *stack.Stack) (func(context.Context) error, error) {
		etcd := cfg.Statements && st.Backend() == stack.BackendEtcd
		var etcd0 []etcdSample
		if cfg.Statements {
			if err := st.ResetStatementStats(ctx); err != nil {
				return nil, err
			}
		}
		if etcd {
			var err error
			if etcd0, err = etcdSamples(ctx, st); err != nil {
				return nil, err
			}
		}
		m.LoadBefore = loadAvg()
		cpu0 := cpuSample(st)
		del0, err := deliveries(ctx, st)
		if err != nil {
			return nil, err
		}
		req0, err := requests(ctx, st)
		if err != nil {
			return nil, err
		}
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			profErrs []error
		)
		if profileSeconds > 0 {
			m.Profiles = map[string]string{}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, err
			}
			for name, addr := range st.PprofAddrs() {
				path := filepath.Join(dir, name+".pprof")
				// Ends when the profile is written or ctx ends.
				wg.Go(func() {
					err := fetchProfile(ctx, "http://"+addr+"/debug/pprof/profile?seconds="+strconv.Itoa(profileSeconds), path)
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						profErrs = append(profErrs, fmt.Errorf("profile of %s: %w", name, err))
						return
					}
					m.Profiles[name] = path
				})
			}
		}
		return func(ctx context.Context) error {
			cpu1 := cpuSample(st)
			del1, err := deliveries(ctx, st)
			if err != nil {
				return err
			}
			req1, err := requests(ctx, st)
			if err != nil {
				return err
			}
			var etcd1 []etcdSample
			if etcd {
				if etcd1, err = etcdSamples(ctx, st); err != nil {
					return err
				}
			}
			wg.Wait()
			m.LoadAfter = loadAvg()
			m.Deliveries = map[string]int{}
			// A counter or a cluster's figure that went down belongs to a
			// part restarted during the run (the crash soak): its new
			// figure is all it did since.
			for name, n := range del1 {
				if n < del0[name] {
					del0[name] = 0
				}
				m.Deliveries[name] = n - del0[name]
			}
			m.CPUSeconds = map[string]float64{}
			for name, c := range cpu1 {
				if c < cpu0[name] {
					cpu0[name] = 0
				}
				m.CPUSeconds[name] = round((c - cpu0[name]).Seconds(), 3)
			}
			if cfg.Statements {
				// Before latency's own queries of paydb.
				if m.Statements, err = st.StatementStats(ctx); err != nil {
					return err
				}
			}
			if err := latency(ctx, st.PayDBURL(), m); err != nil {
				return err
			}
			if cfg.Statements && m.Payouts > 0 {
				m.StatementsPerPayout = map[string]float64{}
				var total int64
				for _, s := range m.Statements {
					m.StatementsPerPayout[s.Database] += float64(s.Calls)
					total += s.Calls
				}
				for db, n := range m.StatementsPerPayout {
					m.StatementsPerPayout[db] = round(n/float64(m.Payouts), 2)
				}
				m.StatementsPerPayout["total"] = round(float64(total)/float64(m.Payouts), 2)
			}
			if etcd && m.Payouts > 0 {
				m.EtcdPerPayout = etcdPerPayout(etcd0, etcd1, m.Payouts)
			}
			if m.Payouts > 0 {
				m.RequestsPerPayout = map[string]float64{}
				var total float64
				for k, n := range req1 {
					if d := n - req0[k]; d > 0 { // a restarted part's counter starts again: skipped
						m.RequestsPerPayout[k] = round(d/float64(m.Payouts), 2)
						total += d
					}
				}
				m.RequestsPerPayout["total"] = round(total/float64(m.Payouts), 2)
			}
			m.CPUPerPayoutMs = map[string]float64{}
			var total float64
			for name, s := range m.CPUSeconds {
				total += s
				if m.Payouts > 0 {
					m.CPUPerPayoutMs[name] = round(s*1000/float64(m.Payouts), 2)
				}
			}
			if m.Payouts > 0 {
				m.CPUPerPayoutMs["total"] = round(total*1000/float64(m.Payouts), 2)
			}
			return errors.Join(profErrs...)
		}, nil
	}
}

// cpuSample returns the CPU time used so far by every process of st (the
// sum over the processes of one name, so that a restarted process counts
// with its predecessor), by each PostgreSQL cluster, and by this process.
func cpuSample(st *stack.Stack) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, p := range st.Processes() {
		if d, err := p.CPU(); err == nil {
			out[p.Name()] += d
		}
	}
	for name, d := range st.ClusterCPU() {
		out[name] = d
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		out["bench"] = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return out
}

// deliveries returns, by executor name, the requests each executor has
// answered so far (the sum of its function_requests_total series).
func deliveries(ctx context.Context, st *stack.Stack) (map[string]int, error) {
	out := map[string]int{}
	for _, p := range st.Processes() {
		name, ok := strings.CutPrefix(p.Name(), "executor-")
		if !ok {
			continue
		}
		fams, err := scrape(ctx, st.ExecutorURL(name)+"/metrics")
		if err != nil {
			return nil, fmt.Errorf("deliveries of executor %s: %w", name, err)
		}
		var n float64
		for _, m := range fams[httpmetrics.NameRequests].GetMetric() {
			n += m.GetCounter().GetValue()
		}
		out[name] = int(n)
	}
	return out, nil
}

// requests returns the requests each HTTP service of st has answered so
// far, by "service route" (lock-server's by operation), summed over the
// executors and over the answers' classes and codes.
func requests(ctx context.Context, st *stack.Stack) (map[string]float64, error) {
	out := map[string]float64{}
	add := func(service, url, metric, label string) error {
		fams, err := scrape(ctx, url+"/metrics")
		if err != nil {
			return fmt.Errorf("requests of %s: %w", service, err)
		}
		for _, m := range fams[metric].GetMetric() {
			out[service+" "+labelOf(m, label)] += m.GetCounter().GetValue()
		}
		return nil
	}
	for _, svc := range []struct{ name, url string }{
		{"payment-resource", st.PaymentResourceURL()}, {"rail-proxy", st.RailProxyURL()}, {"rail-stub", st.RailStubURL()},
	} {
		if err := add(svc.name, svc.url, httpmetrics.NameRequests, "route"); err != nil {
			return nil, err
		}
	}
	if err := add("lock-server", st.LockServerURL(), "lockserver_requests_total", "op"); err != nil {
		return nil, err
	}
	for _, p := range st.Processes() {
		if name, ok := strings.CutPrefix(p.Name(), "executor-"); ok {
			if err := add("executor", st.ExecutorURL(name), httpmetrics.NameRequests, "route"); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// latency reads every posted payout's creation and posting times from
// paydb and fills m's payouts, seconds, rate and percentiles.
func latency(ctx context.Context, dsn string, m *Measurement) error {
	db, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	rows, err := db.Query(ctx, `SELECT min(at) FILTER (WHERE from_state IS NULL), max(at) FILTER (WHERE to_state = 'posted')
		FROM payout_transition GROUP BY payout_id HAVING bool_or(to_state = 'posted')`)
	if err != nil {
		return err
	}
	var (
		lat         []float64
		first, last time.Time
	)
	for rows.Next() {
		var created, posted time.Time
		if err := rows.Scan(&created, &posted); err != nil {
			rows.Close()
			return err
		}
		lat = append(lat, float64(posted.Sub(created).Microseconds())/1000)
		if first.IsZero() || created.Before(first) {
			first = created
		}
		if posted.After(last) {
			last = posted
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	m.Payouts = len(lat)
	m.LatencyMs = Percentiles(lat)
	var lag []float64
	rows, err = db.Query(ctx, `SELECT extract(epoch FROM published_at - created_at) * 1000 FROM outbox WHERE published_at IS NOT NULL`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var ms float64
		if err := rows.Scan(&ms); err != nil {
			rows.Close()
			return err
		}
		lag = append(lag, ms)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	m.OutboxLagMs = Percentiles(lag)
	if m.Payouts > 0 {
		m.Seconds = round(last.Sub(first).Seconds(), 3)
		if m.Seconds > 0 {
			m.PayoutsPerSecond = round(float64(m.Payouts)/m.Seconds, 1)
		}
	}
	return nil
}

// Percentiles returns the p50, p95, p99 and max of xs (nearest rank),
// rounded to 0.1; zeros for an empty xs. xs is sorted in place.
func Percentiles(xs []float64) map[string]float64 {
	out := map[string]float64{"p50": 0, "p95": 0, "p99": 0, "max": 0}
	if len(xs) == 0 {
		return out
	}
	slices.Sort(xs)
	for name, p := range map[string]float64{"p50": 50, "p95": 95, "p99": 99, "max": 100} {
		i := int(math.Ceil(p/100*float64(len(xs)))) - 1
		out[name] = round(xs[max(i, 0)], 1)
	}
	return out
}

func round(x float64, digits int) float64 {
	f := math.Pow(10, float64(digits))
	return math.Round(x*f) / f
}

// loadAvg returns the machine's 1-minute load average, or -1.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

// fetchProfile GETs url (a pprof endpoint) and writes the answer to path.
func fetchProfile(ctx context.Context, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s", resp.Status, b)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// quiet is a discarding logger for runs without Config.Log.
var quiet = slog.New(slog.DiscardHandler)
