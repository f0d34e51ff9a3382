package lowrank

// The Go kernels: the reference loops of MulQ, MulTP and Decompose, in an
// order of memory accesses that suits scalar code (Q read in its own
// row-major layout), with the same sums in the same order per element.

// mulQGeneric is MulQ's reference loop, the 32 partial sums of every k of
// a row kept side by side.
func mulQGeneric(p, m []float32, rows, cols int, q []float32, r int) {
	acc, h := scratch32(32 * r)
	defer pool32.Put(h)
	for i := range rows {
		clear(acc)
		row := m[i*cols : (i+1)*cols]
		for j, v := range row {
			qj := q[j*r : (j+1)*r]
			a := acc[j%32:]
			for k, w := range qj {
				a[32*k] += float32(v * w)
			}
		}
		pi := p[i*r : (i+1)*r]
		for k := range pi {
			pi[k] = fold32((*[32]float32)(acc[32*k:]))
		}
	}
}

// fold32 adds the 32 partial sums of MulQ in halves: lane l gets lane
// l+16, then l+8, l+4, l+2, l+1, as the assembly's reduction does.
func fold32(a *[32]float32) float32 {
	for w := 16; w >= 1; w /= 2 {
		for l := range w {
			a[l] += a[l+w]
		}
	}
	return a[0]
}

// mulTPGeneric is MulTP's reference loop: the block's sums s (laid out
// as q) row by row, then q += s.
func mulTPGeneric(q, m []float32, rows, cols int, p []float32, r int) {
	s, h := scratch32(cols * r)
	defer pool32.Put(h)
	clear(q)
	for b := 0; b < rows; b += tpBlock {
		clear(s)
		for i := b; i < min(b+tpBlock, rows); i++ {
			row := m[i*cols : (i+1)*cols]
			pi := p[i*r : (i+1)*r]
			for j, v := range row {
				sj := s[j*r : (j+1)*r]
				for k, w := range pi {
					sj[k] += float32(v * w)
				}
			}
		}
		for x, v := range s {
			q[x] += v
		}
	}
}

// decomposeGeneric is Decompose's reference loop, with scale·qAvg
// computed once.
func decomposeGeneric(out, res, m []float32, rows, cols int, p, qAvg, qOwn []float32, r int, scale float32) {
	if scale != 1 {
		qs, h := scratch32(len(qAvg))
		defer pool32.Put(h)
		for x, v := range qAvg {
			qs[x] = scale * v
		}
		qAvg = qs
	}
	for i := range rows {
		pi := p[i*r : (i+1)*r]
		o, e, mi := out[i*cols:(i+1)*cols], res[i*cols:(i+1)*cols], m[i*cols:(i+1)*cols]
		for j := range o {
			qa, qo := qAvg[j*r:(j+1)*r], qOwn[j*r:(j+1)*r]
			a := float32(pi[0] * qa[0])
			w := float32(pi[0] * qo[0])
			for k := 1; k < r; k++ {
				a += float32(pi[k] * qa[k])
				w += float32(pi[k] * qo[k])
			}
			o[j] = a
			e[j] = mi[j] - w
		}
	}
}

// sumKernel is the benchmarks' yardstick: one read of a matrix, as fast
// as the CPU reads (the sum itself is only there to use what is read).
var sumKernel = sumGeneric

// sumGeneric returns the sum of x in eight running sums.
func sumGeneric(x []float32) float32 {
	var s [8]float32
	i := 0
	for ; i+8 <= len(x); i += 8 {
		v := (*[8]float32)(x[i:])
		for l := range v {
			s[l] += v[l]
		}
	}
	for ; i < len(x); i++ {
		s[0] += x[i]
	}
	return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))
}
