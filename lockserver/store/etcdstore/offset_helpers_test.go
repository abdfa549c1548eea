package etcdstore

import (
	"encoding/json"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// recordT decodes the record of a lock key.
func recordT(t *testing.T, kv *mvccpb.KeyValue) record {
	t.Helper()
	var rec record
	if err := json.Unmarshal(kv.Value, &rec); err != nil {
		t.Fatalf("key %q holds %q, not a lock record: %v", kv.Key, kv.Value, err)
	}
	return rec
}

// offsetT reads the token offset of s's prefix from etcd (0 when absent).
func offsetT(t *testing.T, s *Store) int64 {
	t.Helper()
	resp, err := s.cli.Get(ctxT(t), s.offsetKey())
	if err != nil {
		t.Fatalf("read the token offset: %v", err)
	}
	v, err := s.parseOffset(resp.Kvs)
	if err != nil {
		t.Fatal(err)
	}
	return v.x
}
