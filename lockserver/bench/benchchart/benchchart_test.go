package benchchart_test

import (
	"bytes"
	"errors"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/bench/benchchart"
)

// testdata/bench.txt is three rounds of `bench.test -test.bench
// AcquireRelease -test.benchtime 1s -test.cpu 1,2` on the development
// machine (2026-12-02, shared with a build: its figures are only a
// fixture, docs/benchmarks.md gives the measured ones).
func readFixture(t *testing.T) []benchchart.Series {
	t.Helper()
	f, err := os.Open("testdata/bench.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	series, err := benchchart.Read(f)
	if err != nil {
		t.Fatal(err)
	}
	return series
}

func find(series []benchchart.Series, backend, path string, procs, clients int) (benchchart.Point, bool) {
	for _, s := range series {
		if s.Backend == backend && s.Path == path && s.Procs == procs {
			for _, p := range s.Points {
				if p.Clients == clients {
					return p, true
				}
			}
		}
	}
	return benchchart.Point{}, false
}

// The expected figures are the fixture's own lines, inverted by hand:
// memory/sdk/clients=1 at GOMAXPROCS 1 took 118427, 156377 and 139061
// ns/op in its three rounds; at GOMAXPROCS 2 ("-2") 209134, 210322 and
// 330850; etcd/raw/clients=64-2 411274, 477150 and 234714.
func TestReadTakesTheMedianRoundOfEachRow(t *testing.T) {
	series := readFixture(t)
	for _, c := range []struct {
		backend, path           string
		procs, clients          int
		median, lowest, highest float64
	}{
		{"memory", "sdk", 1, 1, 1e9 / 139061, 1e9 / 156377, 1e9 / 118427},
		{"memory", "sdk", 2, 1, 1e9 / 210322, 1e9 / 330850, 1e9 / 209134},
		{"etcd", "raw", 2, 64, 1e9 / 411274, 1e9 / 477150, 1e9 / 234714},
	} {
		p, ok := find(series, c.backend, c.path, c.procs, c.clients)
		if !ok {
			t.Errorf("%s/%s GOMAXPROCS %d clients %d: no point", c.backend, c.path, c.procs, c.clients)
			continue
		}
		near := func(a, b float64) bool { return math.Abs(a-b) < 1e-6*b }
		if !near(p.PairsPerSec, c.median) || !near(p.Min, c.lowest) || !near(p.Max, c.highest) || p.Rounds != 3 {
			t.Errorf("%s/%s GOMAXPROCS %d clients %d = %+v; want median %.1f, lowest %.1f, highest %.1f over 3 rounds",
				c.backend, c.path, c.procs, c.clients, p, c.median, c.lowest, c.highest)
		}
	}
}

// Every path of every backend the benchmark has is read, with its three
// client counts, at both GOMAXPROCS, and nothing else.
func TestReadFindsEveryPathOfEveryBackend(t *testing.T) {
	series := readFixture(t)
	want := map[string][]string{
		"memory":   {"sdk", "sdk-nobatch"},
		"etcd":     {"raw", "raw-lease-per-lock", "sdk", "sdk-nobatch", "store-batched"},
		"postgres": {"raw", "sdk", "sdk-nobatch", "store-batched"},
		"redis":    {"redsync"},
	}
	got := map[string]int{}
	for _, s := range series {
		got[s.Backend+"/"+s.Path]++
		if len(s.Points) != 3 || s.Points[0].Clients != 1 || s.Points[1].Clients != 8 || s.Points[2].Clients != 64 {
			t.Errorf("%s/%s GOMAXPROCS %d: points %+v; want clients 1, 8, 64 in order", s.Backend, s.Path, s.Procs, s.Points)
		}
	}
	n := 0
	for b, paths := range want {
		for _, p := range paths {
			n++
			if got[b+"/"+p] != 2 {
				t.Errorf("%s/%s: %d series; want 2 (GOMAXPROCS 1 and 2)", b, p, got[b+"/"+p])
			}
		}
	}
	if len(series) != 2*n {
		t.Errorf("%d series; want %d", len(series), 2*n)
	}
}

func TestReadRefusesWhatItCannotChart(t *testing.T) {
	for name, c := range map[string]struct {
		in   string
		want error
	}{
		"no path":             {"BenchmarkAcquireRelease/backend=etcd/clients=8-2 \t 100\t 5000 ns/op\n", benchchart.ErrName},
		"clients not a count": {"BenchmarkAcquireRelease/backend=etcd/path=raw/clients=many \t 100\t 5000 ns/op\n", benchchart.ErrName},
		"no pairs rows": {"BenchmarkLoopbackRoundTrip/peer=process-2 \t 20000\t 37418 ns/op\n" +
			"BenchmarkContended/backend=etcd/path=wait/clients=8-2 \t 3000\t 2800000 ns/op\n", benchchart.ErrNoRows},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := benchchart.Read(strings.NewReader(c.in)); !errors.Is(err, c.want) {
				t.Errorf("Read = %v; want %v", err, c.want)
			}
		})
	}
}

func TestWriteSVGDrawsOnePanelPerBackendAndALinePerPath(t *testing.T) {
	series := readFixture(t)
	var b bytes.Buffer
	if err := benchchart.WriteSVG(&b, "pairs", series, 2); err != nil {
		t.Fatal(err)
	}
	svg := b.String()
	if !strings.HasPrefix(strings.TrimSpace(svg), "<?xml") || !strings.Contains(svg, "<svg") {
		t.Fatalf("not an SVG: %.80q", svg)
	}
	for _, s := range []string{"etcd (GOMAXPROCS 2)", "memory (GOMAXPROCS 2)", "postgres (GOMAXPROCS 2)", "redis (GOMAXPROCS 2)",
		">raw<", ">raw-lease-per-lock<", ">sdk<", ">sdk-nobatch<", ">store-batched<", ">redsync<"} {
		if !strings.Contains(svg, s) {
			t.Errorf("the SVG lacks %q", s)
		}
	}
	if err := benchchart.WriteSVG(&b, "pairs", series, 3); !errors.Is(err, benchchart.ErrNoRows) {
		t.Errorf("WriteSVG at GOMAXPROCS 3 = %v; want ErrNoRows", err)
	}
}
