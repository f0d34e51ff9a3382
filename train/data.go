package train

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// The digit images: ImageSide × ImageSide pixels, one of Classes labels.
const (
	ImageSide = 8
	Features  = ImageSide * ImageSide
	Classes   = 10
)

// Dataset is a set of labelled examples: example i is the Features values
// X[i*Features : (i+1)*Features] (row-major pixels) with label Y[i] in
// [0, Classes).
type Dataset struct {
	X []float32
	Y []uint8
}

// Len returns the number of examples.
func (d *Dataset) Len() int { return len(d.Y) }

// Example returns the pixels of example i (a view into X).
func (d *Dataset) Example(i int) []float32 { return d.X[i*Features : (i+1)*Features] }

// Digits generates the train and test sets of the demo: nTrain and nTest
// 8×8 images of the digits 0–9, each drawn from a stroke template (polylines
// on the unit square) with random perturbations, then rendered:
//
//   - every template point moves by N(0, 0.03²) in each coordinate;
//   - an affine map about the centre: rotation U(−0.3, 0.3) rad, scales
//     U(0.8, 1.1) per axis, shear U(−0.25, 0.25), shift U(−0.1, 0.1) per axis;
//   - strokes are drawn with a Gaussian profile exp(−d²/2σ²), σ U(0.045,
//     0.075), d the distance from the pixel centre to the nearest segment,
//     and scaled by a contrast U(0.6, 1);
//   - with probability 0.3 a random clutter segment is drawn as well;
//   - every pixel gets N(0, NoiseStd²) noise (see DigitsNoise).
//
// Labels cycle 0, 1, …, 9 so the classes are balanced. Example i of the
// train set is a pure function of (seed, i) — the PCG generator of
// math/rand/v2 seeded with (seed, 2i), whose output is fixed by its
// definition — and example i of the test set of (seed, 2i+1): the two sets
// are disjoint draws, and neither depends on the other's size. Generation
// never fails for sizes ≥ 0; negative sizes are an error.
func Digits(seed uint64, nTrain, nTest int) (trainSet, testSet *Dataset, err error) {
	if nTrain < 0 || nTest < 0 {
		return nil, nil, fmt.Errorf("train: dataset sizes %d (train) and %d (test), want ≥ 0", nTrain, nTest)
	}
	gen := func(n int, stream uint64) *Dataset {
		d := &Dataset{X: make([]float32, n*Features), Y: make([]uint8, n)}
		for i := range n {
			label := uint8(i % Classes)
			d.Y[i] = label
			r := newRNG(seed, 2*uint64(i)+stream)
			renderDigit(d.Example(i), label, &r)
		}
		return d
	}
	return gen(nTrain, 0), gen(nTest, 1), nil
}

// DigitsNoise is the standard deviation of the pixel noise Digits adds;
// stroke intensities are at most 1.
const DigitsNoise = 0.2

// point is a position on the unit square, y pointing down.
type point struct{ x, y float64 }

// templates holds each digit's strokes, as polylines.
var templates = func() [Classes][][]point {
	// arc returns the points of an elliptic arc from angle a0 to a1
	// (degrees; 0 is right, 90 is down).
	arc := func(cx, cy, rx, ry, a0, a1 float64) []point {
		const steps = 10
		pts := make([]point, steps+1)
		for i := range pts {
			a := (a0 + (a1-a0)*float64(i)/steps) * math.Pi / 180
			pts[i] = point{cx + rx*math.Cos(a), cy + ry*math.Sin(a)}
		}
		return pts
	}
	line := func(xy ...float64) []point {
		pts := make([]point, len(xy)/2)
		for i := range pts {
			pts[i] = point{xy[2*i], xy[2*i+1]}
		}
		return pts
	}
	return [Classes][][]point{
		0: {arc(0.5, 0.5, 0.22, 0.32, 0, 360)},
		1: {line(0.5, 0.15, 0.5, 0.85), line(0.36, 0.3, 0.5, 0.15)},
		2: {append(arc(0.5, 0.35, 0.2, 0.18, 180, 405), line(0.28, 0.85, 0.76, 0.85)...)},
		3: {arc(0.5, 0.32, 0.2, 0.17, 200, 450), arc(0.5, 0.67, 0.22, 0.18, 270, 520)},
		4: {line(0.62, 0.85, 0.62, 0.15, 0.25, 0.62, 0.78, 0.62)},
		5: {append(line(0.72, 0.15, 0.32, 0.15, 0.3, 0.47), arc(0.5, 0.63, 0.22, 0.2, 235, 500)...)},
		6: {line(0.66, 0.15, 0.45, 0.3, 0.32, 0.5, 0.3, 0.65), arc(0.5, 0.65, 0.2, 0.2, 0, 360)},
		7: {line(0.25, 0.15, 0.75, 0.15, 0.42, 0.85)},
		8: {arc(0.5, 0.31, 0.17, 0.16, 0, 360), arc(0.5, 0.68, 0.21, 0.19, 0, 360)},
		9: {arc(0.5, 0.35, 0.2, 0.2, 0, 360), line(0.7, 0.38, 0.66, 0.6, 0.55, 0.85)},
	}
}()

// renderDigit draws one perturbed image of label into dst (Features values).
func renderDigit(dst []float32, label uint8, r *rng) {
	theta := r.uniform(-0.3, 0.3)
	sx, sy := r.uniform(0.8, 1.1), r.uniform(0.8, 1.1)
	shear := r.uniform(-0.25, 0.25)
	tx, ty := r.uniform(-0.1, 0.1), r.uniform(-0.1, 0.1)
	cos, sin := math.Cos(theta), math.Sin(theta)
	// The map: centre, scale and shear, rotate, shift back and translate.
	affine := func(p point) point {
		x, y := (p.x-0.5)*sx, (p.y-0.5)*sy
		x += shear * y
		return point{cos*x - sin*y + 0.5 + tx, sin*x + cos*y + 0.5 + ty}
	}
	var segs [][2]point
	for _, stroke := range templates[label] {
		prev := point{}
		for i, p := range stroke {
			q := affine(point{p.x + 0.03*r.normal(), p.y + 0.03*r.normal()})
			if i > 0 {
				segs = append(segs, [2]point{prev, q})
			}
			prev = q
		}
	}
	if r.float64() < 0.3 {
		a := point{r.float64(), r.float64()}
		b := point{a.x + r.uniform(-0.3, 0.3), a.y + r.uniform(-0.3, 0.3)}
		segs = append(segs, [2]point{a, b})
	}
	sigma := r.uniform(0.045, 0.075)
	contrast := r.uniform(0.6, 1)
	for py := range ImageSide {
		for px := range ImageSide {
			c := point{(float64(px) + 0.5) / ImageSide, (float64(py) + 0.5) / ImageSide}
			d2 := math.Inf(1)
			for _, s := range segs {
				d2 = min(d2, segmentDist2(c, s[0], s[1]))
			}
			v := contrast*math.Exp(-d2/(2*sigma*sigma)) + DigitsNoise*r.normal()
			dst[py*ImageSide+px] = float32(v)
		}
	}
}

// segmentDist2 returns the squared distance from p to the segment ab.
func segmentDist2(p, a, b point) float64 {
	dx, dy := b.x-a.x, b.y-a.y
	t := 0.0
	if l2 := dx*dx + dy*dy; l2 > 0 {
		t = min(1, max(0, ((p.x-a.x)*dx+(p.y-a.y)*dy)/l2))
	}
	ex, ey := a.x+t*dx-p.x, a.y+t*dy-p.y
	return ex*ex + ey*ey
}

// rng draws the numbers of the demo from PCG's 64-bit outputs only, with
// conversions defined here, so that a seed fixes every value.
type rng struct{ src *rand.PCG }

func newRNG(seed, stream uint64) rng { return rng{rand.NewPCG(seed, stream)} }

// float64 returns a uniform value in [0, 1) with 53 random bits.
func (r *rng) float64() float64 { return float64(r.src.Uint64()>>11) / (1 << 53) }

// uniform returns a uniform value in [lo, hi).
func (r *rng) uniform(lo, hi float64) float64 { return lo + (hi-lo)*r.float64() }

// normal returns a standard normal value (Box–Muller, one of the pair).
func (r *rng) normal() float64 {
	u := 1 - r.float64() // (0, 1]
	return math.Sqrt(-2*math.Log(u)) * math.Cos(2*math.Pi*r.float64())
}

// intn returns a value in [0, n) (n > 0); the modulo bias is below n/2⁶⁴.
func (r *rng) intn(n int) int { return int(r.src.Uint64() % uint64(n)) }

// shuffle permutes p uniformly (Fisher–Yates).
func (r *rng) shuffle(p []int32) {
	for i := len(p) - 1; i > 0; i-- {
		j := r.intn(i + 1)
		p[i], p[j] = p[j], p[i]
	}
}
