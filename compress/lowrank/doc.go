// Package lowrank holds the CPU kernels of PowerSGD (Vogels, Karimireddy
// and Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
// Distributed Optimization", NeurIPS 2019): rank-r compression of a
// gradient matrix by one step of subspace (power) iteration, warm-started
// from the previous step's Q.
//
// Matrices are row-major float32 slices: M is rows×cols, P is rows×r, Q is
// cols×r, with r ≥ 1 small (1 to 32 typically). One PowerSGD round on a
// worker, with M the gradient plus the error-feedback residual of the
// previous round, is
//
//	MulQ(p, m, rows, cols, q, r)          // P = M·Q                  (one pass over M)
//	  all-reduce P (sum or mean)
//	Orthogonalize(p, rows, r)             // P̂ = orthonormal basis of P (in place)
//	MulTP(qOwn, m, rows, cols, p, r)      // Q = Mᵀ·P̂                 (one pass over M)
//	  all-reduce Q into qAvg
//	Decompose(out, res, m, rows, cols, p, qAvg, qOwn, r, scale)
//	                                      // out = P̂·(scale·qAvg)ᵀ, the averaged gradient;
//	                                      // res = M − P̂·qOwnᵀ, the new residual (one pass over M)
//
// and scale·qAvg (or qOwn) is the next round's warm start Q. scale is 1
// when the all-reduce of Q averages, 1/n when it sums over n workers. A
// column that Orthogonalize zeroed (rank-deficient P) stays zero in the
// next round unless the caller refills that column of Q. Each worker
// computes the same P̂ from the same all-reduced P, bit for bit: the
// kernels sum in fixed orders that do not depend on the CPU's vector width,
// on the assembly or Go version in use, or on how a caller splits rows
// among goroutines (see each function's doc for its reference loop).
//
// Kernels. On amd64 with AVX-512F (and the OS saving the ZMM state) the
// four functions run assembly loops; with AVX2 and FMA but no AVX-512F,
// MulQ, MulTP and Decompose run AVX2 assembly (half as fast) and
// Orthogonalize its Go loops; elsewhere, or with -tags purego, all run Go
// loops. All compute the same bits: every float32 product is rounded
// before it is added, as the assembly's separate multiply and add do (no
// fused multiply-add on either side; on the FPUs that matter here a
// multiply and an add issue as fast as a fused multiply-add, to different
// pipes), and every sum follows the reference loop its function's doc
// states. The assembly kernels are bound by the multiplies (r per element
// of m for MulQ and MulTP, 2r for Decompose) or by memory; on a
// 1024×1024 matrix at r = 4 one round takes 3.0 to 3.3 times as long as
// reading m twice on an AVX-512 EPYC (BenchmarkRound; docs/PERFORMANCE.md,
// "PowerSGD's kernels").
//
// Concurrency and aliasing. The functions keep no state between calls
// (scratch buffers come from a sync.Pool) and may run concurrently on
// disjoint outputs. MulQ and Decompose work row by row: calling them on
// row ranges m[i0*cols:i1*cols], p[i0*r:i1*r] (and out, res likewise) from
// several goroutines gives the same bits as one call on all rows. MulTP
// sums over rows and is one call. Outputs must not overlap inputs, except
// that Decompose's res may be m itself (the residual in place). Slices of
// the wrong length, negative sizes, r < 1 and forbidden overlaps panic:
// they are programming errors the caller's validation should have caught.
//
// Non-finite input (NaN, ±Inf) in MulQ, MulTP and Decompose propagates to
// the outputs it touches, as IEEE arithmetic does (the NaN's payload is
// unspecified); Orthogonalize zeroes all of P for non-finite input.
package lowrank
