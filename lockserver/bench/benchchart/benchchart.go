// Package benchchart reads the output of lockserver/bench's
// BenchmarkAcquireRelease (Read: the Go benchmark format, as `make bench`
// writes it to bin/bench.txt) and draws acquire+release pairs per second
// against concurrent clients (WriteSVG), one line per path and one panel
// per backend; a point is the median round of a row, with the lowest and
// highest round. It reads with golang.org/x/perf/benchfmt and draws with
// gonum.org/v1/plot; benchstat compares runs but draws no chart.
package benchchart

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/svgplot"
	"golang.org/x/perf/benchfmt"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Benchmark is the base name of the rows read: the uncontended
// acquire+release pairs of lockserver/bench (the contended rows measure
// handoffs, not pairs, and are left out).
const Benchmark = "BenchmarkAcquireRelease"

// ErrNoRows: the input held no BenchmarkAcquireRelease line (or none at
// the GOMAXPROCS asked for).
var ErrNoRows = errors.New("benchchart: no AcquireRelease rows")

// ErrName: a BenchmarkAcquireRelease line's name lacks its backend=, path=
// or clients= part, gives one twice, has a part that is none of them (its
// rounds would be pooled with those of a different configuration), or
// clients is not a positive integer; or the line's sec/op does not give a
// finite, positive number of pairs per second.
var ErrName = errors.New("benchchart: malformed row name")

// Point is one row of the chart: a path at one number of clients, over
// every round read.
type Point struct {
	// Clients is the number of concurrent clients (the row's clients=).
	Clients int
	// PairsPerSec is the median round's pairs per second; Min and Max
	// the lowest and highest round's.
	PairsPerSec, Min, Max float64
	// Rounds is the number of rounds (benchmark lines) of the row.
	Rounds int
}

// Series is one line of the chart: one path of one backend at one
// GOMAXPROCS, its points sorted by clients.
type Series struct {
	Backend, Path string
	// Procs is the GOMAXPROCS of the rows (the name's -N suffix; 1 when
	// the name has none, as `go test` writes it).
	Procs  int
	Points []Point
}

// Read parses benchmark output and returns one Series per backend, path
// and GOMAXPROCS of BenchmarkAcquireRelease, sorted by backend, then path,
// then GOMAXPROCS. Other benchmarks and non-benchmark lines are skipped.
// It returns ErrName for a row whose name cannot be read, a
// *benchfmt.SyntaxError for a malformed benchmark line, ErrNoRows when no
// row was found, and the reader's error.
func Read(r io.Reader) ([]Series, error) {
	rounds := map[rowKey]map[int][]float64{}
	br := benchfmt.NewReader(r, "bench")
	for br.Scan() {
		var res *benchfmt.Result
		switch rec := br.Result().(type) {
		case *benchfmt.SyntaxError:
			return nil, rec
		case *benchfmt.Result:
			res = rec
		default:
			continue
		}
		base, parts := res.Name.Parts()
		if "Benchmark"+string(base) != Benchmark {
			continue
		}
		k, clients, err := rowOf(res.Name.String(), parts)
		if err != nil {
			return nil, err
		}
		sec, ok := res.Value("sec")
		if !ok {
			sec, ok = res.Value("sec/op")
		}
		if !ok || !(sec > 0) || math.IsInf(1/sec, 0) {
			return nil, fmt.Errorf("%w: %s has no sec/op that gives a finite, positive rate", ErrName, res.Name)
		}
		if rounds[k] == nil {
			rounds[k] = map[int][]float64{}
		}
		rounds[k][clients] = append(rounds[k][clients], 1/sec)
	}
	if err := br.Err(); err != nil {
		return nil, err
	}
	if len(rounds) == 0 {
		return nil, ErrNoRows
	}
	var out []Series
	for k, byClients := range rounds {
		s := Series{Backend: k.backend, Path: k.path, Procs: k.procs}
		for c, xs := range byClients {
			slices.Sort(xs)
			s.Points = append(s.Points, Point{Clients: c, PairsPerSec: median(xs), Min: xs[0], Max: xs[len(xs)-1], Rounds: len(xs)})
		}
		slices.SortFunc(s.Points, func(a, b Point) int { return a.Clients - b.Clients })
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Series) int {
		if c := strings.Compare(a.Backend, b.Backend); c != 0 {
			return c
		}
		if c := strings.Compare(a.Path, b.Path); c != 0 {
			return c
		}
		return a.Procs - b.Procs
	})
	return out, nil
}

// rowKey names a Series.
type rowKey struct {
	backend, path string
	procs         int
}

// rowOf reads a row's backend, path, GOMAXPROCS and clients from the parts
// of its name (benchfmt.Name.Parts: "/key=value" parts, then "-N"). Any
// other part, or one of the three given twice, is refused: rows whose
// names differ only there would otherwise be pooled as one.
func rowOf(name string, parts [][]byte) (rowKey, int, error) {
	k := rowKey{procs: 1}
	clients := 0
	seen := map[string]bool{}
	for _, p := range parts {
		s := string(p)
		if n, ok := strings.CutPrefix(s, "-"); ok {
			procs, err := strconv.Atoi(n)
			if err != nil || procs < 1 {
				return rowKey{}, 0, fmt.Errorf("%w: %s: GOMAXPROCS %q", ErrName, name, n)
			}
			k.procs = procs
			continue
		}
		kv, _ := strings.CutPrefix(s, "/")
		key, val, _ := strings.Cut(kv, "=")
		if seen[key] {
			return rowKey{}, 0, fmt.Errorf("%w: %s: %s= given twice", ErrName, name, key)
		}
		seen[key] = true
		switch key {
		case "backend":
			k.backend = val
		case "path":
			k.path = val
		case "clients":
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 {
				return rowKey{}, 0, fmt.Errorf("%w: %s: clients %q", ErrName, name, val)
			}
			clients = n
		default:
			return rowKey{}, 0, fmt.Errorf("%w: %s: part %q is not backend=, path= or clients=", ErrName, name, s)
		}
	}
	if k.backend == "" || k.path == "" || clients == 0 {
		return rowKey{}, 0, fmt.Errorf("%w: %s: want backend=, path= and clients=", ErrName, name)
	}
	return k, clients, nil
}

// median of sorted xs (the lower middle of an even count, so that every
// point is a round that was measured).
func median(xs []float64) float64 { return xs[(len(xs)-1)/2] }

// pathColors give each path the same colour in every panel.
var pathColors = map[string]color.RGBA{
	"raw":                {R: 90, G: 90, B: 90, A: 255},
	"raw-lease-per-lock": {R: 160, G: 160, B: 160, A: 255},
	"sdk":                {B: 200, A: 255},
	"sdk-nobatch":        {R: 200, A: 255},
	"store-batched":      {G: 140, A: 255},
	"redsync":            {R: 200, G: 120, A: 255},
}

// otherColors are given, in turn, to the paths pathColors does not name,
// in the order of their names, so that no two lines of a panel share a
// colour while there are colours left (then they repeat).
var otherColors = []color.RGBA{
	{R: 140, B: 140, A: 255},
	{G: 150, B: 150, A: 255},
	{R: 150, G: 80, B: 20, A: 255},
	{R: 230, G: 40, B: 150, A: 255},
	{R: 100, G: 100, B: 230, A: 255},
	{R: 120, G: 170, A: 255},
}

// WriteSVG draws the series of GOMAXPROCS procs as SVG (gonum.org/v1/plot,
// vgsvg): one panel per backend, two to a row, pairs/s against clients on
// logarithmic axes, one line per path (the median round, with a bar from
// the lowest to the highest round). title heads the chart. It returns
// ErrNoRows when no series has that GOMAXPROCS, and the drawing's error.
func WriteSVG(w io.Writer, title string, series []Series, procs int) error {
	byBackend := map[string][]Series{}
	var backends []string
	for _, s := range series {
		if s.Procs != procs {
			continue
		}
		if byBackend[s.Backend] == nil {
			backends = append(backends, s.Backend)
		}
		byBackend[s.Backend] = append(byBackend[s.Backend], s)
	}
	if len(backends) == 0 {
		return fmt.Errorf("%w at GOMAXPROCS %d", ErrNoRows, procs)
	}
	const cols, panelW, panelH, titleH = 2, 380, 300, 28
	rows := (len(backends) + cols - 1) / cols
	plots := make([][]*plot.Plot, rows)
	for i := range plots {
		plots[i] = make([]*plot.Plot, cols)
	}
	for i, b := range backends {
		p, err := panel(fmt.Sprintf("%s (GOMAXPROCS %d)", b, procs), byBackend[b])
		if err != nil {
			return err
		}
		plots[i/cols][i%cols] = p
	}
	height := vg.Points(float64(panelH*rows + titleH))
	c := vgsvg.New(vg.Points(panelW*cols), height)
	dc := draw.New(c)
	dc.FillText(text.Style{Color: color.Black, Font: font.From(plot.DefaultFont, 14), Handler: plot.DefaultTextHandler},
		vg.Point{X: vg.Points(12), Y: height - vg.Points(20)}, title)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Points(12), PadY: vg.Points(12), PadTop: vg.Points(titleH), PadBottom: vg.Points(6)}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		for j, p := range plots[i] {
			if p != nil {
				p.Draw(canvases[i][j])
			}
		}
	}
	return svgplot.WriteCanvas(w, c)
}

// panel is one backend's plot.
func panel(title string, series []Series) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "concurrent clients"
	p.Y.Label.Text = "acquire+release pairs per second"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = logTicks{}, logTicks{}
	p.Legend.Top, p.Legend.Left = false, false // lower right: lines rise with clients
	p.Legend.XOffs, p.Legend.YOffs = vg.Points(-8), vg.Points(4)
	lo, hi, right := 0.0, 0.0, 1.0
	others := 0 // paths without a colour of their own so far (series are sorted by path)
	for _, s := range series {
		pts := make([]svgplot.Point, len(s.Points))
		for i, pt := range s.Points {
			pts[i] = svgplot.Point{X: float64(pt.Clients), Y: pt.PairsPerSec, Min: pt.Min, Max: pt.Max, Bar: pt.Rounds >= 2 && pt.Max > pt.Min}
			if lo == 0 || pt.Min < lo {
				lo = pt.Min
			}
			hi, right = max(hi, pt.Max), max(right, float64(pt.Clients))
		}
		c, ok := pathColors[s.Path]
		if !ok {
			c = otherColors[others%len(otherColors)]
			others++
		}
		if err := svgplot.AddRange(p, s.Path, c, pts); err != nil {
			return nil, err
		}
	}
	p.X.Min, p.X.Max = 0.8, right*1.5
	p.Y.Min, p.Y.Max = lo/4, hi*1.5 // room below for the legend
	return p, nil
}

// logTicks marks 1, 2 and 5 times each power of ten in range, labelled,
// and the other digits unlabelled, so that a panel spanning less than a
// decade still has labels (plot.LogTicks labels powers of ten only).
type logTicks struct{}

// Ticks implements plot.Ticker.
func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for p := math.Pow(10, math.Floor(math.Log10(lo))); p <= hi; p *= 10 {
		for d := 1.0; d <= 9; d++ {
			v := d * p
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if d == 1 || d == 2 || d == 5 {
				t.Label = strconv.FormatFloat(v, 'f', -1, 64)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}
