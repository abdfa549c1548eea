// Package svgplot is the plumbing the project's charts share on top of
// gonum.org/v1/plot: a line of medians with a bar for each point's range,
// and the SVG writing. Each chart keeps its own axes, labels and layout.
package svgplot

import (
	"bytes"
	"image/color"
	"io"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Point is one point of a Range line: the median Y at X, and the lowest
// and highest of the runs behind it, drawn as a vertical bar when Bar.
type Point struct {
	X, Y, Min, Max float64
	Bar            bool
}

// AddRange adds to p a line with dots through pts in colour c, a bar
// from Min to Max at each point with Bar, and a legend entry name.
func AddRange(p *plot.Plot, name string, c color.Color, pts []Point) error {
	xys := make(plotter.XYs, len(pts))
	for i, pt := range pts {
		xys[i] = plotter.XY{X: pt.X, Y: pt.Y}
	}
	line, dots, err := plotter.NewLinePoints(xys)
	if err != nil {
		return err
	}
	line.Color, line.Width = c, vg.Points(1.5)
	dots.Color, dots.Radius = c, vg.Points(2.5)
	p.Add(line, dots)
	p.Legend.Add(name, line, dots)
	for _, pt := range pts {
		if !pt.Bar {
			continue
		}
		bar, err := plotter.NewLine(plotter.XYs{{X: pt.X, Y: pt.Min}, {X: pt.X, Y: pt.Max}})
		if err != nil {
			return err
		}
		bar.Color = c
		p.Add(bar)
	}
	return nil
}

// Write draws p on an SVG canvas of width by height and writes it to w.
func Write(w io.Writer, p *plot.Plot, width, height vg.Length) error {
	c := vgsvg.New(width, height)
	p.Draw(draw.New(c))
	return WriteCanvas(w, c)
}

// WriteCanvas writes a drawn canvas to w in one write.
func WriteCanvas(w io.Writer, c *vgsvg.Canvas) error {
	var buf bytes.Buffer
	if _, err := c.WriteTo(&buf); err != nil {
		return err
	}
	_, err := w.Write(buf.Bytes())
	return err
}
