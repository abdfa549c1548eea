package benche2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/distributed-lock-lab/distributed-lock-lab/local/stack"
)

// What etcd served during a run (Measurement.EtcdPerPayout), read from
// etcd's own metrics, which every member serves at /metrics on its client
// URL: every member is scraped as the load starts and once the run has
// settled. A request reaches one member, so the gRPC requests and the
// read-only transactions are summed over the members; every member
// applies, writes to its WAL and commits to its backend every committed
// entry, so the rows of etcdLeaderRows are the leader's alone (the member
// that leads at the end of the run), the work of one member's disk.

// Rows of Measurement.EtcdPerPayout besides "grpc METHOD".
const (
	etcdGRPCTotal   = "grpc total"
	etcdReadOnlyTxn = "Txn read-only"
)

// etcdLeaderRows are the rows read from the leader, by the metric family
// each is read from (a counter or gauge, or a histogram's count).
var etcdLeaderRows = map[string]string{
	"keys put":            "etcd_mvcc_put_total",
	"keys deleted":        "etcd_mvcc_delete_total",
	"leases expired":      "etcd_debugging_server_lease_expired_total",
	"proposals committed": "etcd_server_proposals_committed_total",
	"WAL fsyncs":          "etcd_disk_wal_fsync_duration_seconds",
	"backend commits":     "etcd_disk_backend_commit_duration_seconds",
}

// etcdRowOrder is the order of the rows after the gRPC methods in the
// report.
var etcdRowOrder = []string{etcdGRPCTotal, etcdReadOnlyTxn, "keys put", "keys deleted", "leases expired",
	"proposals committed", "WAL fsyncs", "backend commits"}

// etcdSample is one member's counters at one moment, by row.
type etcdSample struct {
	rows   map[string]float64
	leader bool
}

// etcdSampleOf reads one member's sample from its metrics.
func etcdSampleOf(fams map[string]*dto.MetricFamily) etcdSample {
	s := etcdSample{rows: map[string]float64{}}
	for _, m := range fams["grpc_server_handled_total"].GetMetric() {
		s.rows["grpc "+labelOf(m, "grpc_method")] += m.GetCounter().GetValue()
	}
	for _, m := range fams["etcd_server_request_duration_seconds"].GetMetric() {
		if labelOf(m, "type") == "ReadonlyTxn" {
			s.rows[etcdReadOnlyTxn] += float64(m.GetHistogram().GetSampleCount())
		}
	}
	for row, name := range etcdLeaderRows {
		for _, m := range fams[name].GetMetric() {
			// etcd exports some totals as gauges
			// (etcd_server_proposals_committed_total).
			s.rows[row] += m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	for _, m := range fams["etcd_server_is_leader"].GetMetric() {
		s.leader = m.GetGauge().GetValue() == 1
	}
	return s
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// etcdPerPayout returns what the members did between before and after
// (one sample per member, in the same order) per payout: each row's
// increase, summed over the members, or the leader's for etcdLeaderRows;
// rows that did not move are left out. A counter that went down belongs to
// a member restarted during the run: its new figure is all it did since.
func etcdPerPayout(before, after []etcdSample, payouts int) map[string]float64 {
	out := map[string]float64{}
	for i, a := range after {
		for row, v := range a.rows {
			if _, ok := etcdLeaderRows[row]; ok && !a.leader {
				continue
			}
			d := v - before[i].rows[row]
			if d < 0 {
				d = v
			}
			if d == 0 {
				continue
			}
			out[row] += d
			if strings.HasPrefix(row, "grpc ") {
				out[etcdGRPCTotal] += d
			}
		}
	}
	for row, d := range out {
		out[row] = round(d/float64(payouts), 2)
	}
	return out
}

// etcdSamples scrapes every etcd member of st, in the order of
// st.EtcdEndpoints.
func etcdSamples(ctx context.Context, st *stack.Stack) ([]etcdSample, error) {
	var out []etcdSample
	for _, ep := range st.EtcdEndpoints() {
		fams, err := scrape(ctx, ep+"/metrics")
		if err != nil {
			return nil, fmt.Errorf("etcd metrics: %w", err)
		}
		out = append(out, etcdSampleOf(fams))
	}
	return out, nil
}

// scrape reads the Prometheus text exposition at url, by metric family.
func scrape(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	fams, err := parseMetrics(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	return fams, nil
}

// parseMetrics parses a Prometheus text exposition.
func parseMetrics(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(r)
}
