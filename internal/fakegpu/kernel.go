package fakegpu

import (
	"encoding/binary"
	"math"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/kernels"
)

// kernel launches body on stream s as kernel op, unless a launch error is
// injected (InjectLaunchError).
func (d *Device) kernel(op string, s gpu.Stream, body func()) error {
	d.mu.Lock()
	err := d.launchErr
	d.mu.Unlock()
	if err != nil {
		return err
	}
	return d.launch(op, s, body)
}

// resetStatus fills a status block with 0xff (no failure), as the kernels
// do first.
func resetStatus(status []byte) {
	for i := range status {
		status[i] = 0xff
	}
}

// setStatus writes the kernels' status word w for a failing element.
func setStatus(status []byte, w int, nf *compress.NonFiniteError) {
	binary.LittleEndian.PutUint64(status[8*w:], uint64(nf.Index)<<32|uint64(math.Float32bits(nf.Value)))
}

// poison sets every element of x to NaN, as the kernels do to a result
// whose inputs failed.
func poison(x []float32) {
	for i := range x {
		x[i] = float32(math.NaN())
	}
}

// Average is kernels.Average in Go.
func (d *Device) Average(s gpu.Stream, a kernels.AverageArgs) error {
	return d.kernel("Average", s, func() {
		out := d.bytes(a.Out, kernels.StatusLen)
		resetStatus(out)
		dst := d.floats(a.Dst, a.N)
		for r := range a.Count {
			if kernels.StatusError(d.bytes(a.Slots+gpu.Ptr(r*a.Stride), kernels.StatusLen)) != nil {
				poison(dst)
				binary.LittleEndian.PutUint64(out[8:], uint64(r))
				return
			}
		}
		if bad := compress.Average(dst, a.Ranks); bad >= 0 {
			setStatus(out, 0, &compress.NonFiniteError{Index: bad, Value: dst[bad]})
		}
	})
}

// Momentum is kernels.Momentum by its host arithmetic,
// kernels.MomentumStep.
func (d *Device) Momentum(s gpu.Stream, a kernels.MomentumArgs) error {
	return d.kernel("Momentum", s, func() {
		status := d.bytes(a.Status, kernels.StatusLen)
		resetStatus(status)
		next := d.floats(a.Next, a.N)
		if bad := kernels.MomentumStep(d.floats(a.Grad, a.N), d.floats(a.U, a.N), next, a.M); bad >= 0 {
			setStatus(status, 0, &compress.NonFiniteError{Index: bad, Value: next[bad]})
		}
	})
}

// Guard is kernels.Guard by its definition, kernels.GuardRatio.
func (d *Device) Guard(s gpu.Stream, a kernels.GuardArgs) error {
	return d.kernel("Guard", s, func() {
		rho := kernels.GuardRatio(d.floats(a.Resid, a.N), d.floats(a.Grad, a.N))
		for q := range a.Count {
			putGuard(d.bytes(a.Dst+gpu.Ptr(q*a.Stride), kernels.GuardLen), rho)
		}
	})
}

// GuardMax is kernels.GuardMax in Go.
func (d *Device) GuardMax(s gpu.Stream, a kernels.GuardMaxArgs) error {
	return d.kernel("GuardMax", s, func() {
		m := 0.0
		for q := range a.Count {
			if v := math.Float64frombits(binary.LittleEndian.Uint64(d.bytes(a.Src+gpu.Ptr(q*a.Stride), 8))); v > m {
				m = v
			}
		}
		putGuard(d.bytes(a.Dst, kernels.GuardLen), m)
	})
}

// putGuard writes the guard block of rho to b.
func putGuard(b []byte, rho float64) {
	binary.LittleEndian.PutUint64(b, math.Float64bits(rho))
	binary.LittleEndian.PutUint64(b[8:], 0)
}

// Flush is kernels.Flush in Go (compress.ErrorFeedback.Flush's sum).
func (d *Device) Flush(s gpu.Stream, a kernels.FlushArgs) error {
	return d.kernel("Flush", s, func() {
		g, e, out := d.floats(a.Grad, a.N), d.floats(a.Resid, a.N), d.floats(a.ResidOut, a.N)
		for i := range g {
			g[i] = e[i] + g[i]
			out[i] = 0
		}
	})
}

// Scale is kernels.Scale by its host arithmetic, kernels.ScaleStep.
func (d *Device) Scale(s gpu.Stream, a kernels.ScaleArgs) error {
	return d.kernel("Scale", s, func() { kernels.ScaleStep(d.floats(a.X, a.N), a.C) })
}
