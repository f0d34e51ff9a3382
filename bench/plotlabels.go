package bench

import (
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
)

// Label placement in PlotRatioError, as factors on both axes: a codec's
// point within labelReach of a point already labelled with that codec gets
// no label of its own; a point within joinReach of a labelled point of
// another codec adds its codec to that label.
const (
	labelReach = 1.5
	joinReach  = 1.05
)

// pointLabels returns the label of each result's point in PlotRatioError:
// its codec, one codec per line when points coincide, or empty where a
// nearby label already names it.
func pointLabels(rs []Result) []string {
	labels := make([]string, len(rs))
	within := func(a, b Result, f float64) bool {
		return max(a.RelL2Error, b.RelL2Error)/min(a.RelL2Error, b.RelL2Error) < f &&
			max(a.Ratio, b.Ratio)/min(a.Ratio, b.Ratio) < f
	}
next:
	for i, r := range rs {
		for j := range i {
			if rs[j].Codec == r.Codec && within(rs[j], r, labelReach) {
				continue next
			}
		}
		for j := range i {
			if labels[j] != "" && within(rs[j], r, joinReach) {
				if !slices.Contains(strings.Split(labels[j], "\n"), r.Codec) {
					labels[j] += "\n" + r.Codec
				}
				continue next
			}
		}
		labels[i] = r.Codec
	}
	return labels
}

// placement is one way to set a label beside its point: the text's
// alignment and its offset from the point.
type placement struct {
	xAlign text.XAlignment
	yAlign text.YAlignment
	offset vg.Point
}

// placements are tried in order: right of the point (first line level with
// it), right above, right below, then the same on the left.
var placements = []placement{
	{text.XLeft, text.YTop, vg.Point{X: 5, Y: 5}},
	{text.XLeft, text.YBottom, vg.Point{X: 4, Y: 3}},
	{text.XLeft, text.YTop, vg.Point{X: 4, Y: -3}},
	{text.XRight, text.YTop, vg.Point{X: -5, Y: 5}},
	{text.XRight, text.YBottom, vg.Point{X: -4, Y: 3}},
	{text.XRight, text.YTop, vg.Point{X: -4, Y: -3}},
}

// box returns the rectangle a w×h label placed this way beside pt covers.
func (p placement) box(pt vg.Point, w, h vg.Length) vg.Rectangle {
	at := pt.Add(p.offset)
	lo := vg.Point{X: at.X + vg.Length(p.xAlign)*w, Y: at.Y + vg.Length(p.yAlign)*h}
	return vg.Rectangle{Min: lo, Max: vg.Point{X: lo.X + w, Y: lo.Y + h}}
}

// overlap returns the area two rectangles share.
func overlap(a, b vg.Rectangle) vg.Length {
	w := min(a.Max.X, b.Max.X) - max(a.Min.X, b.Min.X)
	h := min(a.Max.Y, b.Max.Y) - max(a.Min.Y, b.Min.Y)
	if w <= 0 || h <= 0 {
		return 0
	}
	return w * h
}

// placeLabels picks a placement (an index into placements) for each label
// at pts, in order, greedily: the first that overlaps neither the obstacles
// nor the labels already placed, else the one with the least overlap. An
// empty label gets placement 0 and covers nothing.
func placeLabels(pts []vg.Point, labels []string, sty text.Style, obstacles []vg.Rectangle) []int {
	chosen := make([]int, len(labels))
	taken := slices.Clone(obstacles)
	for i, l := range labels {
		if l == "" {
			continue
		}
		w, h := sty.Width(l), sty.Height(l)
		best, bestArea := 0, vg.Length(-1)
		for k, p := range placements {
			b := p.box(pts[i], w, h)
			var area vg.Length
			for _, t := range taken {
				area += overlap(b, t)
			}
			if bestArea < 0 || area < bestArea {
				best, bestArea = k, area
			}
			if area == 0 {
				break
			}
		}
		chosen[i] = best
		taken = append(taken, placements[best].box(pts[i], w, h))
	}
	return chosen
}

// addPlacedLabels adds labels at xys to p, placed apart from each other, the
// glyphs and a top-right legend of legendRows rows in a plot drawn w×h,
// whose axes must already have their final ranges. Positions on the canvas
// are estimated from the axes and a fixed allowance for the axis labels,
// title and margins.
func addPlacedLabels(p *plot.Plot, xys plotter.XYs, labels []string, legendRows int, w, h vg.Length) error {
	const glyph = 4 // half the side of a glyph's box, in points
	left, bottom := vg.Length(60), vg.Length(45)
	dw, dh := w-left-10, h-bottom-25
	pts := make([]vg.Point, len(xys))
	var obstacles []vg.Rectangle
	for i, xy := range xys {
		pts[i] = vg.Point{X: vg.Length(p.X.Norm(xy.X)) * dw, Y: vg.Length(p.Y.Norm(xy.Y)) * dh}
		obstacles = append(obstacles, vg.Rectangle{
			Min: vg.Point{X: pts[i].X - glyph, Y: pts[i].Y - glyph},
			Max: vg.Point{X: pts[i].X + glyph, Y: pts[i].Y + glyph},
		})
	}
	legendW, legendH := vg.Length(100), vg.Length(14*legendRows)
	obstacles = append(obstacles, vg.Rectangle{Min: vg.Point{X: dw - legendW, Y: dh - legendH}, Max: vg.Point{X: dw, Y: dh}})
	all, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: labels})
	if err != nil {
		return err
	}
	chosen := placeLabels(pts, labels, all.TextStyle[0], obstacles)
	for k, pl := range placements {
		var set plotter.XYLabels
		for i, c := range chosen {
			if c == k && labels[i] != "" {
				set.XYs = append(set.XYs, xys[i])
				set.Labels = append(set.Labels, labels[i])
			}
		}
		if len(set.XYs) == 0 {
			continue
		}
		l, err := plotter.NewLabels(set)
		if err != nil {
			return err
		}
		for i := range l.TextStyle {
			l.TextStyle[i].XAlign, l.TextStyle[i].YAlign = pl.xAlign, pl.yAlign
		}
		l.Offset = pl.offset
		p.Add(l)
	}
	return nil
}
