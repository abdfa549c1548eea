package bench

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// walFsyncs returns how many times the embedded etcd member has synced
// its write-ahead log to disk (etcd_disk_wal_fsync_duration_seconds'
// count, which etcd registers in the process's default registry), and
// false when no etcd runs in this process. Each fsync commits every raft
// entry proposed since the previous one, so fsyncs per operation show
// how well concurrent writes share the disk, a figure the load of a
// shared machine hardly moves.
func walFsyncs() (uint64, bool) {
	if etcdCluster == nil {
		return 0, false
	}
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		return 0, false
	}
	for _, mf := range mfs {
		if mf.GetName() == "etcd_disk_wal_fsync_duration_seconds" && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount(), true
		}
	}
	return 0, false
}

// fsyncMeter reports, on an etcd row (a benchmark whose name has
// backend=etcd), the etcd WAL fsyncs per operation between its start and
// its report, as "wal-fsyncs/op". It includes the background writes the
// operations caused while the row ran (the pool's lease grants, the
// revocations of ended grants' leases).
type fsyncMeter struct {
	b     *testing.B
	start uint64
	on    bool
}

func meterFsyncs(b *testing.B) fsyncMeter {
	if !strings.Contains(b.Name(), "backend=etcd") {
		return fsyncMeter{}
	}
	n, ok := walFsyncs()
	return fsyncMeter{b: b, start: n, on: ok}
}

func (m fsyncMeter) report() {
	if !m.on || m.b.N == 0 {
		return
	}
	if n, ok := walFsyncs(); ok {
		m.b.ReportMetric(float64(n-m.start)/float64(m.b.N), "wal-fsyncs/op")
	}
}
