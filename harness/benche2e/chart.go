package benche2e

import (
	"fmt"
	"image/color"
	"io"
	"slices"

	"github.com/distributed-lock-lab/distributed-lock-lab/internal/svgplot"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Point is one point of the creators chart: the median payouts/s of the
// runs of one series (backend, mode, variant) at one number of
// concurrent creators, with the lowest and highest run.
type Point struct {
	Creators         int
	PayoutsPerSecond float64
	Min, Max         float64
	Runs             int
}

// Series is one line of the creators chart.
type Series struct {
	// Name is "backend mode variant" (the variant is left out when every
	// run has the same one).
	Name   string
	Points []Point
}

// CreatorsSeries groups the runs of results (any number of benchmark
// invocations, typically one per -creators value) by backend, mode and
// variant, and within each by creators: the median payouts/s with the
// lowest and highest run. Runs with a broken check are left out. Series
// come sorted by name, points by creators.
func CreatorsSeries(results ...*Result) []Series {
	type key struct{ backend, mode, variant string }
	byKey := map[key]map[int][]RunResult{}
	variants := map[string]bool{}
	for _, res := range results {
		for _, r := range res.Runs {
			if len(r.Failures) > 0 || r.Payouts == 0 {
				continue
			}
			k := key{r.Backend, r.Mode, r.Variant}
			if byKey[k] == nil {
				byKey[k] = map[int][]RunResult{}
			}
			byKey[k][r.Creators] = append(byKey[k][r.Creators], r)
			variants[r.Variant] = true
		}
	}
	var out []Series
	for k, byCreators := range byKey {
		s := Series{Name: k.backend + " " + k.mode}
		if len(variants) > 1 {
			s.Name += " " + k.variant
		}
		for c, rs := range byCreators {
			f := func(r RunResult) float64 { return r.PayoutsPerSecond }
			s.Points = append(s.Points, Point{Creators: c, PayoutsPerSecond: median(rs, f), Min: minOf(rs, f), Max: maxOf(rs, f), Runs: len(rs)})
		}
		slices.SortFunc(s.Points, func(a, b Point) int { return a.Creators - b.Creators })
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Series) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

// seriesColors are the lines' colours, in series order.
var seriesColors = []color.RGBA{
	{B: 200, A: 255}, {R: 200, A: 255}, {G: 140, A: 255}, {R: 140, B: 140, A: 255},
	{R: 200, G: 120, A: 255}, {G: 140, B: 160, A: 255}, {R: 90, G: 90, B: 90, A: 255}, {R: 120, G: 60, A: 255},
}

// WriteCreatorsSVG draws payouts/s against concurrent creators, one line
// per series (the median run, a vertical bar from the lowest to the
// highest run), with the target as a dashed line when target > 0, as SVG
// (gonum.org/v1/plot, vgsvg). title heads the chart.
func WriteCreatorsSVG(w io.Writer, title string, series []Series, target float64) error {
	if len(series) == 0 {
		return fmt.Errorf("benche2e: no runs to chart")
	}
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "concurrent creators"
	p.Y.Label.Text = "payouts per second (created to posted)"
	p.Legend.Top = true
	p.Legend.Left = true
	top, right := target, 1.0
	for i, s := range series {
		pts := make([]svgplot.Point, len(s.Points))
		for j, pt := range s.Points {
			pts[j] = svgplot.Point{X: float64(pt.Creators), Y: pt.PayoutsPerSecond, Min: pt.Min, Max: pt.Max, Bar: pt.Runs > 1}
			top, right = max(top, pt.Max), max(right, float64(pt.Creators))
		}
		if err := svgplot.AddRange(p, s.Name, seriesColors[i%len(seriesColors)], pts); err != nil {
			return err
		}
	}
	if target > 0 {
		t, err := plotter.NewLine(plotter.XYs{{X: 0, Y: target}, {X: right, Y: target}})
		if err != nil {
			return err
		}
		t.Color = color.RGBA{R: 160, G: 160, B: 160, A: 255}
		t.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(t)
		p.Legend.Add(fmt.Sprintf("target %g/s", target), t)
	}
	p.X.Min, p.Y.Min, p.Y.Max = 0, 0, top*1.1
	return svgplot.Write(w, p, vg.Points(720), vg.Points(400))
}
