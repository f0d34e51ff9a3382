package lowrank

import (
	"fmt"

	"github.com/gradcomp/gradcomp/compress"
)

// Matrix is one compressed tensor of a bucket: M is its Rows×Cols block
// of the bucket, row-major, from element Off.
type Matrix struct {
	Off        int // its first element in the bucket
	Rows, Cols int
	R          int // its rank, min(the spec's rank, Rows, Cols)
	P, Q       int // its P's first element among the P's (Rows·R), its Q's among the Q's (Cols·R)
	Tensor     int // its index among the bucket's tensors: its Q draws' stream is compress.DomainLowRank + Tensor
}

// Layout is how a bucket travels in a PowerSGD round: the compressed
// tensors, and the element ranges [lo, hi) sent uncompressed (ascending,
// apart, adjacent ones merged), whose elements follow the P's in the
// first all-reduce, in that order. The round's buffers, for a world of
// ranks ranks:
//
//	vals1  ranks + PLen + FlatLen   the first all-reduce: the ranks'
//	                                statuses (1 at a rank whose M is not
//	                                finite, else 0), the P's, the
//	                                uncompressed elements
//	vals2  QLen                     the second all-reduce: the Q's
//	qOwn   QLen                     this rank's Q's, Mᵀ·P̂
//	q      QLen                     the Q's P is computed with
//
// and the bucket's M (N elements: e + g with error feedback) and the
// residual (N, which may be M itself). The round is Encode, the first
// all-reduce (a sum), Reduce, the second all-reduce (a sum), Decode; the
// CPU functions here define it, and the device's kernels
// (kernels.LowRankEncode, LowRankReduce, LowRankDecode) compute the same
// bits.
type Layout struct {
	N    int // the bucket's elements
	Mats []Matrix
	Flat [][2]int
	// PLen, QLen and FlatLen are the P's, Q's and uncompressed elements.
	PLen, QLen, FlatLen int
}

// NewLayout lays out a bucket of tensors of the given shapes (rows,
// cols; a 1-D tensor has one row) for rank: a tensor is compressed, at
// rank r = min(rank, rows, cols), when it saves at least minCompression:
// rows·cols ≥ minCompression·(rows + cols)·r. It panics if rank < 1 or a
// shape is negative.
func NewLayout(shapes [][2]int, rank int, minCompression float64) *Layout {
	if rank < 1 {
		panic(fmt.Sprintf("lowrank.NewLayout: rank %d < 1", rank))
	}
	l := &Layout{}
	for j, s := range shapes {
		rows, cols := s[0], s[1]
		if rows < 0 || cols < 0 {
			panic(fmt.Sprintf("lowrank.NewLayout: tensor %d is %d×%d", j, rows, cols))
		}
		n := rows * cols
		r := min(rank, rows, cols)
		if r >= 1 && float64(n) >= minCompression*float64(rows+cols)*float64(r) {
			l.Mats = append(l.Mats, Matrix{Off: l.N, Rows: rows, Cols: cols, R: r, P: l.PLen, Q: l.QLen, Tensor: j})
			l.PLen += rows * r
			l.QLen += cols * r
		} else if n > 0 {
			if k := len(l.Flat) - 1; k >= 0 && l.Flat[k][1] == l.N {
				l.Flat[k][1] += n // adjacent: one range
			} else {
				l.Flat = append(l.Flat, [2]int{l.N, l.N + n})
			}
			l.FlatLen += n
		}
		l.N += n
	}
	return l
}

// Encode is a round's first step on this rank: it sets vals1's statuses
// to zero, then, if m holds a NaN or ±Inf, vals1[rank] to 1 and the rest
// of vals1 to zero, and returns false. Otherwise it draws q's columns
// (every column when fresh is set, else only those that are all zero,
// e.g. a warm start's columns the orthogonalization zeroed; see DrawQ),
// writes each matrix's P = M·Q (MulQ) and copies the uncompressed
// elements, and returns true.
func (l *Layout) Encode(vals1, m, q []float32, fresh bool, ranks, rank int, seed uint64, key compress.Key) bool {
	status := vals1[:ranks]
	clear(status)
	if !finite(m) {
		status[rank] = 1
		clear(vals1[ranks:])
		return false
	}
	ps := vals1[ranks : ranks+l.PLen]
	for _, mt := range l.Mats {
		qm := q[mt.Q : mt.Q+mt.Cols*mt.R]
		DrawQ(qm, mt.Cols, mt.R, fresh, seed, key, mt.Tensor)
		MulQ(ps[mt.P:mt.P+mt.Rows*mt.R], m[mt.Off:mt.Off+mt.Rows*mt.Cols], mt.Rows, mt.Cols, qm, mt.R)
	}
	flat := vals1[ranks+l.PLen:]
	for _, f := range l.Flat {
		flat = flat[copy(flat, m[f[0]:f[1]]):]
	}
	return true
}

// Failed returns the lowest rank whose status in the summed vals1 is not
// zero (its M was not finite), or −1: a round that failed on some rank
// goes no further on any (the device fills the gradient with NaN, the
// host engine exchanges the bucket dense).
func Failed(vals1 []float32, ranks int) int {
	for q, v := range vals1[:ranks] {
		if v != 0 {
			return q
		}
	}
	return -1
}

// Reduce is the step between the all-reduces: it orthogonalizes each
// matrix's summed P in vals1 in place (Orthogonalize), writes this rank's
// Q = Mᵀ·P̂ to qOwn (MulTP) and copies qOwn to vals2.
func (l *Layout) Reduce(vals1, m, qOwn, vals2 []float32, ranks int) {
	ps := vals1[ranks:]
	for _, mt := range l.Mats {
		p := ps[mt.P : mt.P+mt.Rows*mt.R]
		Orthogonalize(p, mt.Rows, mt.R)
		MulTP(qOwn[mt.Q:mt.Q+mt.Cols*mt.R], m[mt.Off:mt.Off+mt.Rows*mt.Cols], mt.Rows, mt.Cols, p, mt.R)
	}
	copy(vals2, qOwn)
}

// Decode is a round's last step, on the summed vals2: with inv =
// 1/float32(ranks) it writes each matrix's average P̂·(inv·Q̄)ᵀ to out
// and its residual M − P̂·qOwnᵀ to res (res may be m; Decompose), the
// uncompressed elements' average to out (compress.Average: the sum
// multiplied by inv for a power-of-two world, else divided by ranks;
// vals1's copy is averaged in place) and zeros to res, and, when qNext
// is not nil, inv·Q̄ to qNext (the next round's warm start). It returns
// the lowest of: the offset of the first matrix whose summed Q holds a
// NaN or ±Inf, and the index of the first non-finite uncompressed
// average; −1 when there is none.
func (l *Layout) Decode(out, res, m, vals1, vals2, qOwn, qNext []float32, ranks int) int {
	inv := 1 / float32(ranks)
	ps := vals1[ranks:]
	bad := -1
	for _, mt := range l.Mats {
		n := mt.Rows * mt.Cols
		qAvg := vals2[mt.Q : mt.Q+mt.Cols*mt.R]
		if bad < 0 && !finite(qAvg) {
			bad = mt.Off
		}
		Decompose(out[mt.Off:mt.Off+n], res[mt.Off:mt.Off+n], m[mt.Off:mt.Off+n], mt.Rows, mt.Cols,
			ps[mt.P:mt.P+mt.Rows*mt.R], qAvg, qOwn[mt.Q:mt.Q+mt.Cols*mt.R], mt.R, inv)
	}
	flat := ps[l.PLen:]
	for _, f := range l.Flat {
		k := f[1] - f[0]
		if i := compress.Average(flat[:k], ranks); i >= 0 && (bad < 0 || f[0]+i < bad) {
			bad = f[0] + i
		}
		copy(out[f[0]:f[1]], flat[:k])
		clear(res[f[0]:f[1]]) // delivered exactly
		flat = flat[k:]
	}
	if qNext != nil {
		for i, v := range vals2 {
			qNext[i] = v * inv
		}
	}
	return bad
}

// DrawQ fills the columns of q (cols×r, row-major) that are all zero, or
// every column with all, with uniform draws in [−1, 1): element i of q
// becomes 2·uniform(i) − 1 of the counter RNG's stream (seed, key,
// compress.DomainLowRank + tensor), the same on every rank. A warm Q's
// column is zero where the orthogonalization zeroed P's (a rank-deficient
// P): left so, it would stay zero, every step after.
func DrawQ(q []float32, cols, r int, all bool, seed uint64, key compress.Key, tensor int) {
	var s compress.RandomStream
	drawn := false
	for k := range r {
		if !all {
			zero := true
			for j := range cols {
				if q[j*r+k] != 0 {
					zero = false
					break
				}
			}
			if !zero {
				continue
			}
		}
		if !drawn {
			s, drawn = compress.NewRandomStream(seed, key, compress.DomainLowRank+uint64(tensor)), true
		}
		for j := range cols {
			i := j*r + k
			q[i] = 2*s.Uniform(uint32(i)) - 1
		}
	}
}

// finite reports whether every element of v is finite.
func finite(v []float32) bool {
	for _, x := range v {
		if x-x != 0 {
			return false
		}
	}
	return true
}
