package fakegpu

import (
	"encoding/binary"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/compress/lowrank"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/kernels"
)

// lowRank returns the host views of a's buffers: M, and the two
// all-reduces' buffers.
func (d *Device) lowRank(a kernels.LowRankArgs) (m, vals1, vals2 []float32) {
	l := a.Layout
	return d.floats(a.M, l.N), d.floats(a.Vals1, a.Ranks+l.PLen+l.FlatLen), d.floats(a.Vals2, l.QLen)
}

// LowRankEncode is kernels.LowRankEncode by compress/lowrank's CPU round.
func (d *Device) LowRankEncode(s gpu.Stream, a kernels.LowRankArgs) error {
	return d.kernel("LowRankEncode", s, func() {
		l := a.Layout
		m, vals1, _ := d.lowRank(a)
		g := d.floats(a.Grad, l.N)
		if a.Resid != 0 {
			for i, e := range d.floats(a.Resid, l.N) {
				m[i] = e + g[i]
			}
		} else {
			copy(m, g)
		}
		q := d.floats(a.Q, l.QLen)
		if a.Warm != 0 {
			copy(q, d.floats(a.Warm, l.QLen))
		}
		l.Encode(vals1, m, q, a.Warm == 0, a.Ranks, a.Rank, a.Seed, a.Key)
	})
}

// LowRankReduce is kernels.LowRankReduce by compress/lowrank's CPU round.
func (d *Device) LowRankReduce(s gpu.Stream, a kernels.LowRankArgs) error {
	return d.kernel("LowRankReduce", s, func() {
		m, vals1, vals2 := d.lowRank(a)
		if lowrank.Failed(vals1, a.Ranks) >= 0 {
			clear(vals2)
			return
		}
		a.Layout.Reduce(vals1, m, d.floats(a.QOwn, a.Layout.QLen), vals2, a.Ranks)
	})
}

// LowRankDecode is kernels.LowRankDecode by compress/lowrank's CPU round.
func (d *Device) LowRankDecode(s gpu.Stream, a kernels.LowRankArgs) error {
	return d.kernel("LowRankDecode", s, func() {
		l := a.Layout
		out := d.bytes(a.Out, kernels.StatusLen)
		resetStatus(out)
		m, vals1, vals2 := d.lowRank(a)
		grad := d.floats(a.Grad, l.N)
		if q := lowrank.Failed(vals1, a.Ranks); q >= 0 {
			poison(grad)
			binary.LittleEndian.PutUint64(out[8:], uint64(q))
			return
		}
		var qNext []float32
		if a.QNext != 0 {
			qNext = d.floats(a.QNext, l.QLen)
		}
		if bad := l.Decode(grad, m, m, vals1, vals2, d.floats(a.QOwn, l.QLen), qNext, a.Ranks); bad >= 0 {
			setStatus(out, 0, &compress.NonFiniteError{Index: bad, Value: grad[bad]})
		}
	})
}
