package train

import (
	"math"
	"slices"
	"testing"
)

// randomBatch returns n rows of in inputs drawn from N(0, 1) and labels in
// [0, classes).
func randomBatch(seed uint64, n, in, classes int) ([]float32, []uint8) {
	r := newRNG(seed, 99)
	x := make([]float32, n*in)
	for i := range x {
		x[i] = float32(r.normal())
	}
	y := make([]uint8, n)
	for i := range y {
		y[i] = uint8(r.intn(classes))
	}
	return x, y
}

// TestGradientCheck compares Backward's gradients with central finite
// differences of Loss, parameter by parameter, and checks that each layer's
// gradients are complete when layerDone reports it.
func TestGradientCheck(t *testing.T) {
	widths := []int{5, 7, 6, 4}
	m, err := NewMLP(widths, 3)
	if err != nil {
		t.Fatal(err)
	}
	// Non-zero biases so their gradients are exercised through ReLU too.
	r := newRNG(4, 0)
	for p := 1; p < len(m.Params()); p += 2 {
		for i := range m.Params()[p] {
			m.Params()[p][i] = float32(0.1 * r.normal())
		}
	}
	x, y := randomBatch(5, 3, widths[0], widths[len(widths)-1])
	var order []int
	atDone := make([][]float32, len(m.Params()))
	loss, err := m.Backward(x, y, func(l int) error {
		order = append(order, l)
		for _, p := range []int{2 * l, 2*l + 1} {
			atDone[p] = slices.Clone(m.Grads()[p])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{2, 1, 0}; !slices.Equal(order, want) {
		t.Errorf("layerDone order %v, want %v", order, want)
	}
	if l, _, _ := m.Loss(x, y); math.Abs(l-loss) > 1e-6 {
		t.Errorf("Backward loss %v, Loss %v", loss, l)
	}
	// eps trades truncation error (and the chance of crossing a ReLU kink)
	// against float32 rounding of the perturbed parameter and activations.
	const eps = 1e-3
	const absTol, relTol = 2e-4, 1e-2
	for p, theta := range m.Params() {
		g := m.Grads()[p]
		if !slices.Equal(g, atDone[p]) {
			t.Errorf("parameter %d: gradient changed after its layer was reported done", p)
		}
		for i := range theta {
			orig := theta[i]
			theta[i] = orig + eps
			up, _, _ := m.Loss(x, y)
			theta[i] = orig - eps
			down, _, _ := m.Loss(x, y)
			theta[i] = orig
			num := (up - down) / (float64(orig+eps) - float64(orig-eps))
			if d := math.Abs(num - float64(g[i])); d > absTol+relTol*math.Abs(num) {
				t.Errorf("parameter %d element %d: backward %.6g, finite difference %.6g", p, i, g[i], num)
			}
		}
	}
}

func TestBackwardStopsOnLayerError(t *testing.T) {
	m, err := NewMLP([]int{3, 4, 2}, 1)
	if err != nil {
		t.Fatal(err)
	}
	x, y := randomBatch(1, 2, 3, 2)
	var calls int
	_, err = m.Backward(x, y, func(int) error { calls++; return errTest })
	if err != errTest || calls != 1 {
		t.Errorf("error %v after %d calls, want errTest after 1", err, calls)
	}
}

func TestMLPRejectsBadInput(t *testing.T) {
	for _, widths := range [][]int{nil, {4}, {4, 0, 2}} {
		if _, err := NewMLP(widths, 1); err == nil {
			t.Errorf("NewMLP(%v) accepted", widths)
		}
	}
	m, err := NewMLP([]int{3, 4, 2}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Loss(make([]float32, 5), make([]uint8, 2)); err == nil {
		t.Error("Loss accepted 5 inputs for 2 rows of 3")
	}
	if _, err := m.Backward(make([]float32, 6), []uint8{0, 2}, nil); err == nil {
		t.Error("Backward accepted label 2 of 2 classes")
	}
	if _, err := m.Backward(nil, nil, nil); err == nil {
		t.Error("Backward accepted an empty batch")
	}
	if err := m.BindGrads([][]float32{make([]float32, 12), make([]float32, 4), make([]float32, 8), make([]float32, 3)}); err == nil {
		t.Error("BindGrads accepted a view of 3 for a bias of 2")
	}
}

// TestBindGrads checks that Backward writes into bound storage.
func TestBindGrads(t *testing.T) {
	m, err := NewMLP([]int{3, 4, 2}, 1)
	if err != nil {
		t.Fatal(err)
	}
	x, y := randomBatch(2, 4, 3, 2)
	if _, err := m.Backward(x, y, nil); err != nil {
		t.Fatal(err)
	}
	var want [][]float32
	for _, g := range m.Grads() {
		want = append(want, slices.Clone(g))
	}
	flat := make([]float32, 12+4+8+2)
	views := [][]float32{flat[:12], flat[12:16], flat[16:24], flat[24:]}
	if err := m.BindGrads(views); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Backward(x, y, nil); err != nil {
		t.Fatal(err)
	}
	for p := range views {
		if !slices.Equal(views[p], want[p]) {
			t.Errorf("parameter %d: bound view %v, want %v", p, views[p], want[p])
		}
	}
}
