package harness_test

import (
	"encoding/json"
	"errors"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/harness"
)

var update = flag.Bool("update", false, "rewrite harness/testdata/*.events.json from live runs instead of comparing")

// fixtureCells are the cells whose key events are pinned: both fences on,
// both off.
var fixtureCells = []harness.Cell{{PaymentFencing: true, RailFencing: true}, {PaymentFencing: false, RailFencing: false}}

// TestFixtures checks that a live run still produces, per process, the key
// events of testdata/BACKEND-CELL.events.json, in the same order (see
// harness.NewFixture for what is kept), on the backends of backendsOf.
// With -update it rewrites the fixtures from the live runs instead (all
// of them with -matrix.full):
//
//	go test ./harness -run TestFixtures -update -matrix.full
func TestFixtures(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, etcd, Pub/Sub and every service as processes")
	}
	for _, cell := range fixtureCells {
		for _, backend := range backendsOf(cell) {
			t.Run(backend+"/"+cell.Name(), func(t *testing.T) {
				r := runOf(t, backend, cell)
				got, err := harness.NewFixture(r)
				if err != nil {
					t.Fatal(err)
				}
				path := filepath.Join("testdata", backend+"-"+cell.Name()+".events.json")
				if *update {
					js, err := got.MarshalJSON() // json.Marshal would compact it
					if err != nil {
						t.Fatal(err)
					}
					if err := os.MkdirAll("testdata", 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(path, js, 0o644); err != nil {
						t.Fatal(err)
					}
					t.Logf("wrote %s", path)
					return
				}
				b, err := os.ReadFile(path)
				if errors.Is(err, fs.ErrNotExist) {
					t.Fatalf("%s is missing; generate it with: go test ./harness -run TestFixtures -update -matrix.full", path)
				}
				if err != nil {
					t.Fatal(err)
				}
				var want harness.Fixture
				if err := json.Unmarshal(b, &want); err != nil {
					t.Fatalf("%s: %v", path, err)
				}
				if d := got.Diff(&want); d != "" {
					t.Errorf("the live run's key events differ from %s (logs in %s):\n%s\nIf the change is intended: go test ./harness -run TestFixtures -update -matrix.full", path, r.Dir, d)
				}
			})
		}
	}
}
