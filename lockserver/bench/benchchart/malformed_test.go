package benchchart_test

import (
	"bytes"
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/distributed-lock-lab/distributed-lock-lab/lockserver/bench/benchchart"
)

// TestReadRefusesANamePartItDoesNotKnow: rows whose names differ only in
// a part Read does not read (a /window= added to the benchmark, a path
// holding a slash, a key given twice) are not one row: merged, their
// median would be a round of one configuration drawn as the other's. Read
// must refuse such a name rather than pool its rounds.
func TestReadRefusesANamePartItDoesNotKnow(t *testing.T) {
	for name, in := range map[string]string{
		"an extra part": "BenchmarkAcquireRelease/backend=m/path=sdk/clients=1/window=0 1 100 ns/op\n" +
			"BenchmarkAcquireRelease/backend=m/path=sdk/clients=1/window=1ms 1 1000 ns/op\n" +
			"BenchmarkAcquireRelease/backend=m/path=sdk/clients=1/window=2ms 1 10000 ns/op\n",
		"a path with a slash": "BenchmarkAcquireRelease/backend=m/path=sdk/fast/clients=1 1 100 ns/op\n",
		"a key given twice":   "BenchmarkAcquireRelease/backend=m/path=sdk/clients=1/clients=8 1 100 ns/op\n",
	} {
		t.Run(name, func(t *testing.T) {
			series, err := benchchart.Read(strings.NewReader(in))
			if !errors.Is(err, benchchart.ErrName) {
				t.Fatalf("Read: %v, %+v; want ErrName", err, series)
			}
		})
	}
}

// TestReadRefusesAThroughputThatIsNotAFiniteNumber: a round of NaN ns/op,
// or one so short that its pairs per second overflow, is refused by Read
// with ErrName, naming the row, not passed on for WriteSVG to fail on
// with the plotter's "NaN data point" (which names nothing) or to draw.
func TestReadRefusesAThroughputThatIsNotAFiniteNumber(t *testing.T) {
	for name, v := range map[string]string{"NaN": "NaN", "overflowing pairs/s": "1e-300"} {
		t.Run(name, func(t *testing.T) {
			in := "BenchmarkAcquireRelease/backend=m/path=sdk/clients=1 1 " + v + " ns/op\n"
			series, err := benchchart.Read(strings.NewReader(in))
			if !errors.Is(err, benchchart.ErrName) || !strings.Contains(err.Error(), "clients=1") {
				t.Fatalf("Read: %v, %+v; want ErrName naming the row", err, series)
			}
		})
	}
}

// TestPathsWithoutAColourOfTheirOwnGetDifferentColours: two paths that
// the palette does not name, drawn in one panel, must not share a colour
// (the legend would name two lines that cannot be told apart).
func TestPathsWithoutAColourOfTheirOwnGetDifferentColours(t *testing.T) {
	in := "BenchmarkAcquireRelease/backend=m/path=new-a/clients=1 1 100 ns/op\n" +
		"BenchmarkAcquireRelease/backend=m/path=new-b/clients=1 1 200 ns/op\n" +
		"BenchmarkAcquireRelease/backend=m/path=new-c/clients=1 1 400 ns/op\n"
	series, err := benchchart.Read(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	var svg bytes.Buffer
	if err := benchchart.WriteSVG(&svg, "t", series, 1); err != nil {
		t.Fatal(err)
	}
	colours := map[string]bool{}
	for _, m := range regexp.MustCompile(`stroke:(#[0-9A-Fa-f]{6})`).FindAllStringSubmatch(svg.String(), -1) {
		if m[1] != "#000000" { // axes, ticks, frame
			colours[m[1]] = true
		}
	}
	if len(colours) != 3 {
		t.Fatalf("line colours %v; want 3, one per path", colours)
	}
}
