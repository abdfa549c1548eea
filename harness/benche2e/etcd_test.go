package benche2e

import (
	"maps"
	"os"
	"testing"
)

// TestEtcdPerPayoutFromTwoRealScrapes: testdata/etcd-metrics-{before,after}.txt
// are the two scrapes of the one etcd member of a real run (`go run
// ./harness/cmd/benche2e -backend etcd -modes hot -runs 1 -hot-payouts 60
// -statements -seed 31`, 60 payouts posted, 2026-12-06), cut to the
// families Observer reads and without gRPC series at zero. The figures
// below are their differences over 60, worked out by hand.
func TestEtcdPerPayoutFromTwoRealScrapes(t *testing.T) {
	before, after := readEtcdSample(t, "before"), readEtcdSample(t, "after")
	want := map[string]float64{
		"grpc LeaseGrant": 1.3, "grpc LeaseKeepAlive": 2.2, "grpc LeaseRevoke": 1.03, "grpc LeaseTimeToLive": 0.13,
		"grpc Range": 2.43, "grpc Txn": 2.38, "grpc total": 9.48, // 78+132+62+8+(148-2)+143 = 569
		"keys put": 1.15, "keys deleted": 1.03, "proposals committed": 4.72, "WAL fsyncs": 3.52, "backend commits": 1.22,
	}
	if got := etcdPerPayout([]etcdSample{before}, []etcdSample{after}, 60); !maps.Equal(got, want) {
		t.Errorf("one member:\n got %v\nwant %v", got, want)
	}
	// A second member that follows: its requests add up, the leader's
	// proposals and disk flushes stand for the cluster's.
	follower := etcdSample{rows: after.rows}
	want["grpc Txn"], want["grpc total"] = 4.77, 18.97
	got := etcdPerPayout([]etcdSample{before, before}, []etcdSample{after, follower}, 60)
	if got["grpc Txn"] != want["grpc Txn"] || got["grpc total"] != want["grpc total"] || got["proposals committed"] != want["proposals committed"] {
		t.Errorf("leader and follower:\n got %v\nwant grpc Txn %v, grpc total %v, proposals committed %v",
			got, want["grpc Txn"], want["grpc total"], want["proposals committed"])
	}
}

func readEtcdSample(t *testing.T, name string) etcdSample {
	t.Helper()
	f, err := os.Open("testdata/etcd-metrics-" + name + ".txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fams, err := parseMetrics(f)
	if err != nil {
		t.Fatal(err)
	}
	return etcdSampleOf(fams)
}
