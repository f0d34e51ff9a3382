package bench

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// WritePlots writes the PNG plots of results into dir (which must exist):
// ratio_vs_error.png (see PlotRatioError) and one throughput_SIZE.png per
// size (see PlotThroughput), SIZE as FormatSize writes it. It returns the
// paths written.
func WritePlots(dir string, results []Result) ([]string, error) {
	var paths []string
	write := func(name string, plot func(io.Writer) error) error {
		path := filepath.Join(dir, name)
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		err = plot(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("bench: writing %s: %w", path, err)
		}
		paths = append(paths, path)
		return nil
	}
	if err := write("ratio_vs_error.png", func(w io.Writer) error { return PlotRatioError(w, results) }); err != nil {
		return paths, err
	}
	for _, n := range sizesOf(results) {
		name := "throughput_" + FormatSize(n) + ".png"
		if err := write(name, func(w io.Writer) error { return PlotThroughput(w, results, n) }); err != nil {
			return paths, err
		}
	}
	return paths, nil
}

// sizesOf returns the distinct sizes of results in first-seen order.
func sizesOf(results []Result) []int {
	var sizes []int
	for _, r := range results {
		if !slices.Contains(sizes, r.Size) {
			sizes = append(sizes, r.Size)
		}
	}
	return sizes
}

// PlotRatioError writes a PNG scatter plot of compression ratio against
// relative L2 error, both on log axes, one glyph shape per size and the
// points labelled with their codecs (see pointLabels), labels set apart
// from each other where they can be. Codecs with zero error (lossless) or
// that failed cannot sit on a log axis and are left out; the title says
// how many.
func PlotRatioError(w io.Writer, results []Result) error {
	const width, height = 20 * vg.Centimeter, 14 * vg.Centimeter
	p := plot.New()
	p.X.Label.Text = "relative L2 error ‖x − D(C(x))‖ / ‖x‖"
	p.Y.Label.Text = "compression ratio (4n / payload bytes)"
	p.Legend.Top = true
	var shown []Result
	for _, r := range results {
		if r.Error == "" && r.RelL2Error > 0 {
			shown = append(shown, r)
		}
	}
	xys := make(plotter.XYs, len(shown))
	for i, r := range shown {
		xys[i] = plotter.XY{X: r.RelL2Error, Y: r.Ratio}
	}
	sizes := sizesOf(shown)
	for i, n := range sizes {
		var pts plotter.XYs
		for j, r := range shown {
			if r.Size == n {
				pts = append(pts, xys[j])
			}
		}
		s, err := plotter.NewScatter(pts)
		if err != nil {
			return err
		}
		s.GlyphStyle.Shape = plotutil.Shape(i)
		s.GlyphStyle.Color = plotutil.Color(i)
		s.GlyphStyle.Radius = vg.Points(3)
		p.Add(s)
		p.Legend.Add(FormatSize(n)+" elements", s)
	}
	p.Title.Text = "Compression ratio vs error"
	if left := len(results) - len(shown); left > 0 {
		p.Title.Text += fmt.Sprintf(" (%d results with zero error or failed not shown)", left)
	}
	if len(shown) > 0 {
		setLogAxis(&p.X, xys, func(xy plotter.XY) float64 { return xy.X })
		setLogAxis(&p.Y, xys, func(xy plotter.XY) float64 { return xy.Y })
		if err := addPlacedLabels(p, xys, pointLabels(shown), len(sizes), width, height); err != nil {
			return err
		}
	}
	return writePNG(w, p, width, height)
}

// setLogAxis makes a a log axis spanning the values v picks from xys, widened
// by a factor of 2 on each side so that glyphs and labels fit.
func setLogAxis(a *plot.Axis, xys plotter.XYs, v func(plotter.XY) float64) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, xy := range xys {
		lo, hi = min(lo, v(xy)), max(hi, v(xy))
	}
	a.Scale = plot.LogScale{}
	a.Tick.Marker = plot.TickerFunc(logTicks)
	a.Min, a.Max = lo/2, hi*2
}

// logTicks places labelled ticks at 1, 2 and 5 times the powers of ten in
// [lo, hi] and unlabelled ones at the other integer multiples.
func logTicks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for p := math.Pow(10, math.Floor(math.Log10(lo))); p <= hi; p *= 10 {
		for m := 1; m < 10; m++ {
			v := float64(m) * p
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || m == 2 || m == 5 {
				t.Label = strconv.FormatFloat(v, 'g', 3, 64)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}

// PlotThroughput writes a PNG bar chart of encode and decode-accumulate
// throughput per codec for the results of one size, with a horizontal line
// at the median memcpy throughput measured alongside them.
func PlotThroughput(w io.Writer, results []Result, size int) error {
	var names []string
	var enc, dec plotter.Values
	var copies []float64
	for _, r := range results {
		if r.Size != size {
			continue
		}
		names = append(names, r.Codec)
		enc = append(enc, r.EncodeGBps)
		dec = append(dec, r.DecodeGBps)
		if r.Error == "" {
			copies = append(copies, r.MemcpyGBps)
		}
	}
	if len(names) == 0 {
		return fmt.Errorf("bench: no result of size %d to plot", size)
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Throughput, %s elements (GB/s of fp32)", FormatSize(size))
	p.Y.Label.Text = "GB/s"
	p.Y.Min = 0
	p.Legend.Top = true
	width := vg.Points(12)
	for i, bars := range []struct {
		label string
		vs    plotter.Values
	}{{"encode", enc}, {"decode-accumulate", dec}} {
		b, err := plotter.NewBarChart(bars.vs, width)
		if err != nil {
			return err
		}
		b.Color = plotutil.Color(i)
		b.LineStyle.Width = 0
		b.Offset = width * vg.Length(2*i-1) / 2
		p.Add(b)
		p.Legend.Add(bars.label, b)
	}
	top := max(slices.Max(enc), slices.Max(dec))
	if len(copies) > 0 {
		slices.Sort(copies)
		m := copies[len(copies)/2]
		line, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: m}, {X: float64(len(names)) - 0.5, Y: m}})
		if err != nil {
			return err
		}
		line.LineStyle.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(line)
		p.Legend.Add(fmt.Sprintf("memcpy (median %.2f GB/s)", m), line)
		top = max(top, m)
	}
	if top > 0 {
		p.Y.Max = 1.3 * top // room for the legend above the bars and the line
	}
	p.NominalX(names...)
	p.X.Tick.Label.Rotation = math.Pi / 4
	p.X.Tick.Label.XAlign = draw.XRight
	p.X.Tick.Label.YAlign = draw.YCenter
	wide := max(16*vg.Centimeter, vg.Length(len(names))*1.6*vg.Centimeter)
	return writePNG(w, p, wide, 14*vg.Centimeter)
}

// writePNG renders p as a w×h PNG.
func writePNG(out io.Writer, p *plot.Plot, w, h vg.Length) error {
	wt, err := p.WriterTo(w, h, "png")
	if err != nil {
		return err
	}
	_, err = wt.WriteTo(out)
	return err
}
