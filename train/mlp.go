package train

import (
	"fmt"
	"math"

	"github.com/gradcomp/gradcomp/overlap"
)

// MLP is a fully connected network: layers of z = W·a + b, ReLU between
// them, and a softmax cross-entropy loss on the last layer's outputs (the
// logits). Parameters and gradients are float32; dot products, gradient sums
// over a batch and the loss accumulate in float64.
//
// Its parameters, in registration order, are W₀, b₀, W₁, b₁, …: parameter
// 2l is layer l's weight matrix W_l (Widths[l+1] rows × Widths[l] columns,
// row-major) and 2l+1 its bias b_l (Widths[l+1] values).
//
// An MLP holds scratch space for its batches: it is not safe for concurrent
// use.
type MLP struct {
	widths []int
	params [][]float32
	grads  [][]float32

	// Scratch for a batch of size batch: acts[l] is the input of layer l
	// (acts[0] is the batch itself, not owned), acts[L] the logits;
	// delta and next hold the loss gradient with respect to a layer's
	// output and input.
	batch       int
	acts        [][]float32
	delta, next []float32
	acc         []float64
}

// NewMLP returns an MLP with the given layer widths (input first, at least
// two, each ≥ 1), weights drawn from N(0, 2/fan-in) (He initialisation) by
// the PCG generator seeded with (seed, layer), and zero biases. Its
// gradients start zero in storage of its own (see BindGrads).
func NewMLP(widths []int, seed uint64) (*MLP, error) {
	if len(widths) < 2 {
		return nil, fmt.Errorf("train: MLP widths %v: need an input and at least one layer", widths)
	}
	for i, w := range widths {
		if w < 1 {
			return nil, fmt.Errorf("train: MLP widths %v: width %d is %d, want ≥ 1", widths, i, w)
		}
	}
	m := &MLP{widths: append([]int(nil), widths...)}
	for l := range len(widths) - 1 {
		in, out := widths[l], widths[l+1]
		w, b := make([]float32, out*in), make([]float32, out)
		r := newRNG(seed, uint64(l))
		std := math.Sqrt(2 / float64(in))
		for i := range w {
			w[i] = float32(std * r.normal())
		}
		m.params = append(m.params, w, b)
		m.grads = append(m.grads, make([]float32, len(w)), make([]float32, len(b)))
	}
	return m, nil
}

// Layers returns the number of layers (len(widths) − 1).
func (m *MLP) Layers() int { return len(m.widths) - 1 }

// ParamSizes returns the element count of each parameter, in registration
// order.
func (m *MLP) ParamSizes() []int {
	sizes := make([]int, len(m.params))
	for i, p := range m.params {
		sizes[i] = len(p)
	}
	return sizes
}

// ParamShapes returns each parameter as a matrix, in registration order:
// W_l is Widths[l+1] × Widths[l], b_l one row of Widths[l+1].
func (m *MLP) ParamShapes() []overlap.Shape {
	shapes := make([]overlap.Shape, 0, len(m.params))
	for l := range m.Layers() {
		in, out := m.widths[l], m.widths[l+1]
		shapes = append(shapes, overlap.Shape{Rows: out, Cols: in}, overlap.Shape{Rows: 1, Cols: out})
	}
	return shapes
}

// Params returns the parameters in registration order: the MLP's own
// slices, which the caller may update in place (the optimizer does).
func (m *MLP) Params() [][]float32 { return m.params }

// Grads returns the gradient slices in registration order, the storage
// Backward writes.
func (m *MLP) Grads() [][]float32 { return m.grads }

// BindGrads makes views the gradient storage: Backward writes parameter p's
// gradient into views[p]. len(views) must equal the parameter count and
// each len(views[p]) the parameter's size; otherwise it returns an error and
// keeps the current storage. A caller that lays the views out contiguously
// per bucket can hand each bucket to a collective as one slice.
func (m *MLP) BindGrads(views [][]float32) error {
	if len(views) != len(m.params) {
		return fmt.Errorf("train: %d gradient views for %d parameters", len(views), len(m.params))
	}
	for p, v := range views {
		if len(v) != len(m.params[p]) {
			return fmt.Errorf("train: gradient view %d has %d elements, parameter has %d", p, len(v), len(m.params[p]))
		}
	}
	m.grads = views
	return nil
}

// Loss returns the mean cross-entropy loss of the examples x (rows of
// Widths[0] values) with labels y, and how many the network classifies
// correctly (the largest logit, ties to the lower class, equals the label).
// It processes x in chunks of at most 256 rows. A length mismatch or a label
// out of range is an error.
func (m *MLP) Loss(x []float32, y []uint8) (loss float64, correct int, err error) {
	if err := m.check(x, y); err != nil {
		return 0, 0, err
	}
	const chunk = 256
	in := m.widths[0]
	var sum float64
	for lo := 0; lo < len(y); lo += chunk {
		hi := min(lo+chunk, len(y))
		m.forward(x[lo*in : hi*in])
		s, c := m.crossEntropy(y[lo:hi], false)
		sum += s
		correct += c
	}
	if len(y) > 0 {
		loss = sum / float64(len(y))
	}
	return loss, correct, nil
}

// Backward runs the batch x (rows of Widths[0] values, labels y, at least
// one row) forward and backward, leaving in the gradient storage the
// gradient of the batch's mean cross-entropy loss, which it returns.
//
// It computes the layers' gradients last layer first, and right after
// layer l's two gradients (parameters 2l and 2l+1) are complete it calls
// layerDone(l), if not nil, before it computes anything of layer l−1; it
// never reads or writes a gradient again once its layer is done, so
// layerDone may hand them to another goroutine. An error from layerDone
// stops Backward, which returns it.
func (m *MLP) Backward(x []float32, y []uint8, layerDone func(layer int) error) (loss float64, err error) {
	if err := m.check(x, y); err != nil {
		return 0, err
	}
	if len(y) == 0 {
		return 0, fmt.Errorf("train: Backward of an empty batch")
	}
	m.forward(x)
	sum, _ := m.crossEntropy(y, true) // delta = ∂(mean loss)/∂logits
	n := len(y)
	delta, next := m.delta, m.next
	for l := m.Layers() - 1; l >= 0; l-- {
		in, out := m.widths[l], m.widths[l+1]
		a := m.acts[l]
		dw, db := m.grads[2*l], m.grads[2*l+1]
		// dW[j][i] = Σ_b delta[b][j]·a[b][i]; db[j] = Σ_b delta[b][j].
		acc := m.acc[:in]
		for j := range out {
			clear(acc)
			var bsum float64
			for b := range n {
				d := float64(delta[b*out+j])
				if d == 0 {
					continue
				}
				bsum += d
				for i, v := range a[b*in : (b+1)*in] {
					acc[i] += d * float64(v)
				}
			}
			row := dw[j*in : (j+1)*in]
			for i, v := range acc {
				row[i] = float32(v)
			}
			db[j] = float32(bsum)
		}
		if layerDone != nil {
			if err := layerDone(l); err != nil {
				return 0, err
			}
		}
		if l == 0 {
			break
		}
		// delta_in[b][i] = (Σ_j W[j][i]·delta[b][j]) · [a[b][i] > 0].
		w := m.params[2*l]
		for b := range n {
			clear(acc)
			for j, d := range delta[b*out : (b+1)*out] {
				if d == 0 {
					continue
				}
				d := float64(d)
				for i, v := range w[j*in : (j+1)*in] {
					acc[i] += d * float64(v)
				}
			}
			for i, v := range a[b*in : (b+1)*in] {
				if v > 0 {
					next[b*in+i] = float32(acc[i])
				} else {
					next[b*in+i] = 0
				}
			}
		}
		delta, next = next, delta
	}
	return sum / float64(n), nil
}

// check validates a batch's shape and labels.
func (m *MLP) check(x []float32, y []uint8) error {
	if len(x) != len(y)*m.widths[0] {
		return fmt.Errorf("train: batch of %d labels has %d inputs, want %d×%d", len(y), len(x), len(y), m.widths[0])
	}
	classes := m.widths[len(m.widths)-1]
	for i, c := range y {
		if int(c) >= classes {
			return fmt.Errorf("train: label %d of example %d out of range [0, %d)", c, i, classes)
		}
	}
	return nil
}

// reserve sizes the scratch for a batch of n rows.
func (m *MLP) reserve(n int) {
	if n <= m.batch {
		return
	}
	m.batch = n
	widest := 0
	m.acts = make([][]float32, len(m.widths))
	for l := 1; l < len(m.widths); l++ {
		m.acts[l] = make([]float32, n*m.widths[l])
		widest = max(widest, m.widths[l])
	}
	widest = max(widest, m.widths[0])
	m.delta, m.next = make([]float32, n*widest), make([]float32, n*widest)
	m.acc = make([]float64, widest)
}

// forward fills acts for the batch x: hidden layers after ReLU, then the
// logits.
func (m *MLP) forward(x []float32) {
	n := len(x) / m.widths[0]
	m.reserve(n)
	m.acts[0] = x
	for l := range m.Layers() {
		in, out := m.widths[l], m.widths[l+1]
		w, bias := m.params[2*l], m.params[2*l+1]
		relu := l < m.Layers()-1
		for b := range n {
			a := m.acts[l][b*in : (b+1)*in]
			z := m.acts[l+1][b*out : (b+1)*out]
			for j := range out {
				s := float64(bias[j])
				for i, v := range w[j*in : (j+1)*in] {
					s += float64(v) * float64(a[i])
				}
				if relu && s < 0 {
					s = 0
				}
				z[j] = float32(s)
			}
		}
	}
}

// crossEntropy returns the summed cross-entropy loss of the logits in
// acts[L] against y and the count of correct predictions; with grad it
// also sets delta to ∂(mean loss)/∂logits = (softmax − onehot)/n.
func (m *MLP) crossEntropy(y []uint8, grad bool) (sum float64, correct int) {
	classes := m.widths[len(m.widths)-1]
	logits := m.acts[len(m.acts)-1]
	n := len(y)
	for b, label := range y {
		z := logits[b*classes : (b+1)*classes]
		best := 0
		for j, v := range z {
			if v > z[best] {
				best = j
			}
		}
		if best == int(label) {
			correct++
		}
		zmax := float64(z[best])
		var norm float64
		for _, v := range z {
			norm += math.Exp(float64(v) - zmax)
		}
		logNorm := zmax + math.Log(norm)
		sum += logNorm - float64(z[label])
		if grad {
			d := m.delta[b*classes : (b+1)*classes]
			for j, v := range z {
				p := math.Exp(float64(v) - logNorm)
				if j == int(label) {
					p--
				}
				d[j] = float32(p / float64(n))
			}
		}
	}
	return sum, correct
}
