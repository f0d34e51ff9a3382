// PowerSGD's round on the device: the kernels of kernels.LowRankEncode,
// LowRankReduce and LowRankDecode (kernels/lowrank.go builds their plans).
// Reference: compress/lowrank (round.go: Layout.Encode, Reduce, Decode,
// DrawQ; lowrank.go: MulQ, MulTP, Decompose; orth.go: Orthogonalize), whose
// documented summation orders are the ones below, so that every result is
// the CPU's bit for bit: each sum is kept by the lane the CPU's reference
// loop gives it, in the same order, and folded the same way.
//
// Each matrix's kernels get pointers to its own blocks (M, P, Q, Q_own, the
// workspace) and its sizes; indices within a block are below 2^32 (a block
// is at most the bucket, compress.MaxElements).
//
// The gate: a u32 in the workspace, GATE_OPEN while the round goes on.
// gc_lowrank_sum closes it when M holds a NaN or ±Inf (LowRankEncode);
// gc_lowrank_gate sets it to the lowest rank whose summed status is not zero
// (LowRankReduce, LowRankDecode). Every later kernel of the call reads it
// first and does only its failure's part when it is closed.
#include "common.cuh"

#define GATE_OPEN 0xffffffffu
#define QNAN_BITS 0x7fc00000u // the quiet NaN a failed round poisons the gradient with (as gc_average)
#define MAX_R 1024            // the largest rank (compress.MaxLowRank): sizes the shared column lists
#define CHUNK 8               // P or Q columns the products keep in registers per pass over M
#define MULQ_TILE 256         // Q rows a gc_lowrank_mulq block stages in shared memory at a time
#define TP_BLOCK 32           // MulTP's block of rows (CPU: lowrank.tpBlock)
#define EPS 1e-6              // CPU: lowrank.Eps

// gate_open reports whether the round goes on.
__device__ __forceinline__ bool gate_open(const u32 *gate) { return *gate == GATE_OPEN; }

// gc_lowrank_sum writes m[i] = e[i] + g[i] rounded once (g[i] itself
// without e; CPU: the caller of Layout.Encode, as the codecs' error
// feedback) and closes the gate if a result is NaN or ±Inf (CPU:
// lowrank.Finite). m may be e.
extern "C" __global__ void gc_lowrank_sum(float *m, const float *g, const float *e, u64 n, u32 *gate) {
  FOR_EACH(i, n) {
    const float v = gsum(g, e, i);
    m[i] = v;
    if (nonfinite(v)) *gate = 0;
  }
}

// gc_lowrank_fail is Layout.Encode's failure: with the gate closed it sets
// this rank's status vals1[rank] to 1 and the n values after the ranks
// statuses (the P's and the uncompressed elements) to zero; with the gate
// open it does nothing.
extern "C" __global__ void gc_lowrank_fail(float *vals1, u32 ranks, u32 rank, u64 n, const u32 *gate) {
  if (gate_open(gate)) return;
  if (blockIdx.x == 0 && threadIdx.x == 0) vals1[rank] = 1.0f;
  FOR_EACH(i, n) vals1[ranks + i] = 0.0f;
}

// uniform returns uniform(i) of the stream whose base is base:
// float32(draw32(i) >> 8)·2^-24, exact (CPU: RandomStream.Uniform).
__device__ __forceinline__ float uniform(u64 base, u32 i) {
  return __fmul_rn(__uint2float_rn(draw32(base, i) >> 8), 5.9604644775390625e-08f);
}

// gc_lowrank_q sets one matrix's Q (cols×r, row-major) as Layout.Encode
// does (CPU: DrawQ): with warm, Q = warm, then every column of warm that is
// all zero is drawn; without (a cold start), every column is drawn. A
// drawn element x becomes 2·uniform(x) − 1 (exact) of the stream base. One
// block: Q is cols·r elements, small beside M.
extern "C" __global__ void gc_lowrank_q(float *q, const float *warm, u32 cols, u32 r, u64 base,
                                        const u32 *gate) {
  __shared__ u32 nonzero[MAX_R / 32]; // bit k: warm's column k has an element that is not ±0
  if (!gate_open(gate)) return;
  const u64 n = (u64)cols * r;
  if (warm) {
    for (u32 w = threadIdx.x; w < MAX_R / 32; w += blockDim.x) nonzero[w] = 0;
    __syncthreads();
    for (u64 x = threadIdx.x; x < n; x += blockDim.x) {
      const u32 k = (u32)x % r, bit = 1u << (k & 31);
      if (warm[x] != 0.0f && !(nonzero[k >> 5] & bit)) atomicOr(&nonzero[k >> 5], bit);
    }
    __syncthreads();
  }
  for (u64 x = threadIdx.x; x < n; x += blockDim.x) {
    const u32 k = (u32)x % r;
    q[x] = warm && (nonzero[k >> 5] >> (k & 31) & 1) ? warm[x]
                                                     : __fsub_rn(__fmul_rn(2.0f, uniform(base, (u32)x)), 1.0f);
  }
}

// mulq_pass computes columns k0 to k0 + rem − 1 (rem ≤ C) of the rows of P
// = M·Q that a gc_lowrank_mulq block has at i0 (a row per warp, rows i0 +
// warp): lane l keeps C sums, one per column, over j ≡ l (mod 32) in
// increasing j, each product rounded before it is added, then the warp
// folds them in halves, lane l adding lane l + w for w = 16, ..., 1 (CPU:
// MulQ's reference loop, acc[j%32] and the fold). The block stages Q's
// rows MULQ_TILE at a time, transposed, in qs; every thread of the block
// calls it.
template <int C>
__device__ __forceinline__ void mulq_pass(float *p, const float *m, u64 i0, u32 rows, u32 cols, const float *q,
                                          u32 r, u32 k0, u32 rem, float (*qs)[MULQ_TILE + 1]) {
  const u32 lane = threadIdx.x & 31;
  const u64 i = i0 + (threadIdx.x >> 5);
  const float *mi = m + i * cols;
  float acc[C];
#pragma unroll
  for (int c = 0; c < C; c++) acc[c] = 0.0f;
  for (u32 j0 = 0; j0 < cols; j0 += MULQ_TILE) {
    const u32 tile = min((u32)MULQ_TILE, cols - j0);
    __syncthreads(); // the previous tile is used up
    for (u32 x = threadIdx.x; x < C * MULQ_TILE; x += blockDim.x) {
      const u32 t = x / C, c = x % C;
      qs[c][t] = t < tile && c < rem ? q[(u64)(j0 + t) * r + k0 + c] : 0.0f;
    }
    __syncthreads();
    if (i < rows) {
      for (u32 t = lane; t < tile; t += 32) {
        const float v = mi[j0 + t];
#pragma unroll
        for (int c = 0; c < C; c++) acc[c] = __fadd_rn(acc[c], __fmul_rn(v, qs[c][t]));
      }
    }
  }
  if (i >= rows) return; // the whole warp
#pragma unroll
  for (int c = 0; c < C; c++) {
    for (int w = 16; w >= 1; w >>= 1) acc[c] = __fadd_rn(acc[c], __shfl_down_sync(0xffffffffu, acc[c], w));
  }
  if (lane == 0) {
#pragma unroll
    for (int c = 0; c < C; c++)
      if (c < rem) p[i * r + k0 + c] = acc[c];
  }
}

// gc_lowrank_mulq writes one matrix's P = M·Q (rows×r, into its block of
// vals1; CPU: MulQ): a warp per row, blockDim.x/32 rows per block at a
// time (grid-stride), CHUNK columns of P per pass over the row (M is read
// once when r ≤ CHUNK); a pass of rem columns keeps the least power of two
// ≥ rem sums per lane.
extern "C" __global__ void gc_lowrank_mulq(float *p, const float *m, u32 rows, u32 cols, const float *q, u32 r,
                                           const u32 *gate) {
  __shared__ float qs[CHUNK][MULQ_TILE + 1];
  if (!gate_open(gate)) return;
  const u32 warps = blockDim.x >> 5;
  for (u64 i0 = (u64)blockIdx.x * warps; i0 < rows; i0 += (u64)gridDim.x * warps) {
    for (u32 k0 = 0; k0 < r; k0 += CHUNK) {
      const u32 rem = min(r - k0, (u32)CHUNK);
      if (rem > 4) mulq_pass<8>(p, m, i0, rows, cols, q, r, k0, rem, qs);
      else if (rem > 2) mulq_pass<4>(p, m, i0, rows, cols, q, r, k0, rem, qs);
      else if (rem > 1) mulq_pass<2>(p, m, i0, rows, cols, q, r, k0, rem, qs);
      else mulq_pass<1>(p, m, i0, rows, cols, q, r, k0, rem, qs);
    }
  }
}

// gc_lowrank_gate sets the gate from the summed statuses vals1[0, ranks):
// to the lowest rank whose status is not zero (CPU: lowrank.Failed), else
// GATE_OPEN; with out (LowRankDecode's status words, reset to ~0) it
// writes that rank to out[1]. One block.
extern "C" __global__ void gc_lowrank_gate(const float *vals1, u32 ranks, u32 *gate, u64 *out) {
  __shared__ u64 scratch[32];
  u64 first = ~0ULL;
  for (u32 q = threadIdx.x; q < ranks; q += blockDim.x) {
    if (vals1[q] != 0.0f) { // NaN too
      first = q;
      break;
    }
  }
  first = block_min_u64(first, scratch);
  if (threadIdx.x == 0) {
    *gate = first == ~0ULL ? GATE_OPEN : (u32)first;
    if (out && first != ~0ULL) out[1] = first;
  }
}

// fold16 adds the sixteen running sums of lanes 0..15 in halves, lane l
// adding lane l + w for w = 8, 4, 2, 1, and returns the total to all
// sixteen (CPU: lowrank.fold16).
__device__ __forceinline__ double fold16(double s) {
  for (int w = 8; w >= 1; w >>= 1) s = __dadd_rn(s, __shfl_down_sync(0xffffu, s, w, 16));
  return __shfl_sync(0xffffu, s, 0, 16);
}

// gc_lowrank_orth orthogonalizes one matrix's summed P (rows×r, in vals1)
// in place by modified Gram-Schmidt on float64 columns w (r columns of
// rows doubles, in the workspace), as lowrank.Orthogonalize does bit for
// bit: a P holding a NaN or ±Inf becomes all +0; else, column by column,
// its norm n₀ and its dot product with the first kept column in one pass,
// then for each kept column in order the update y += (−d)·w_k fused with
// the next dot product (the next kept column's, the last with itself: the
// norm n), every sum a float64 sum of rounded products kept by lane i mod
// 16 in increasing i and folded by fold16; the column is zeroed when n ≤
// Eps·n₀ or n is Inf, else multiplied by 1/n; P gets the columns rounded to
// float32. One block: lanes 0..15 keep the sums (their order allows no
// more), every thread copies, scales and zeroes.
extern "C" __global__ void gc_lowrank_orth(float *p, u32 rows, u32 r, double *w, const u32 *gate) {
  __shared__ int bad, keep;
  __shared__ double inv;
  __shared__ u16 live[MAX_R]; // the kept columns, in order
  if (!gate_open(gate)) return;
  const u32 t = threadIdx.x;
  const u64 n = (u64)rows * r;
  if (t == 0) bad = 0;
  __syncthreads();
  for (u64 x = t; x < n; x += blockDim.x) { // CPU: loadP
    const float v = p[x];
    if (nonfinite(v)) bad = 1;
    w[(u64)((u32)x % r) * rows + (u32)x / r] = (double)v;
  }
  __syncthreads();
  if (bad) {
    for (u64 x = t; x < n; x += blockDim.x) p[x] = 0.0f;
    return;
  }
  u32 nlive = 0; // the same in every thread
  for (u32 c = 0; c < r; c++) {
    double *wc = w + (u64)c * rows;
    if (t < 16) {
      double n0sq, nsq;
      if (nlive == 0) { // CPU: dot2(wc, wc)
        double s = 0.0;
        for (u32 i = t; i < rows; i += 16) s = __dadd_rn(s, __dmul_rn(wc[i], wc[i]));
        n0sq = nsq = fold16(s);
      } else { // CPU: dot2(wc, w_live[0]), then axpyDot per kept column
        const double *w0 = w + (u64)live[0] * rows;
        double s = 0.0, d = 0.0;
        for (u32 i = t; i < rows; i += 16) {
          const double v = wc[i];
          s = __dadd_rn(s, __dmul_rn(v, v));
          d = __dadd_rn(d, __dmul_rn(v, w0[i]));
        }
        n0sq = fold16(s);
        d = fold16(d);
        for (u32 x = 0; x < nlive; x++) {
          const double *wk = w + (u64)live[x] * rows;
          const double *z = x + 1 < nlive ? w + (u64)live[x + 1] * rows : nullptr; // null: wc, updated
          const double nd = -d;
          double e = 0.0;
          for (u32 i = t; i < rows; i += 16) {
            const double y = __dadd_rn(wc[i], __dmul_rn(nd, wk[i]));
            wc[i] = y;
            e = __dadd_rn(e, __dmul_rn(z ? z[i] : y, y));
          }
          d = fold16(e);
        }
        nsq = d;
      }
      if (t == 0) {
        const double n0 = __dsqrt_rn(n0sq), nn = __dsqrt_rn(nsq);
        keep = nn > __dmul_rn(EPS, n0) && !isinf(nn);
        inv = __ddiv_rn(1.0, nn);
      }
    }
    __syncthreads();
    const bool k = keep;
    const double s = inv;
    for (u32 i = t; i < rows; i += blockDim.x) wc[i] = k ? __dmul_rn(wc[i], s) : 0.0;
    if (k) {
      if (t == 0) live[nlive] = (u16)c;
      nlive++;
    }
    __syncthreads();
  }
  for (u64 x = t; x < n; x += blockDim.x) p[x] = __double2float_rn(w[(u64)((u32)x % r) * rows + (u32)x / r]);
}

// tp_pass sums columns k0 to k0 + rem − 1 (rem ≤ C) of block b's products
// m[i][j]·p[i][k] over the block's rows in increasing i, each rounded
// before it is added, into s[b][j][k] (CPU: MulTP's reference loop, the
// block sum s).
template <int C>
__device__ __forceinline__ void tp_pass(float *s, const float *m, u32 i0, u32 i1, u32 cols, u32 j, const float *p,
                                        u32 r, u32 k0, u32 rem) {
  float acc[C];
#pragma unroll
  for (int c = 0; c < C; c++) acc[c] = 0.0f;
  for (u32 i = i0; i < i1; i++) {
    const float v = m[(u64)i * cols + j];
    const float *pi = p + (u64)i * r + k0;
#pragma unroll
    for (int c = 0; c < C; c++)
      if (c < rem) acc[c] = __fadd_rn(acc[c], __fmul_rn(v, pi[c]));
  }
#pragma unroll
  for (int c = 0; c < C; c++)
    if (c < rem) s[k0 + c] = acc[c];
}

// gc_lowrank_tp_blocks is MulTP's first half for one matrix (CPU: MulTP):
// a thread per (block of TP_BLOCK rows b, column j) writes the block sums
// of the r columns of Q's row j to s[b][j][0..r) (the workspace, laid out
// as ceil(rows/TP_BLOCK) Q's), CHUNK at a time.
extern "C" __global__ void gc_lowrank_tp_blocks(float *s, const float *m, u32 rows, u32 cols, const float *p, u32 r,
                                                const u32 *gate) {
  if (!gate_open(gate)) return;
  const u64 n = (u64)((rows + TP_BLOCK - 1) / TP_BLOCK) * cols;
  FOR_EACH(x, n) {
    const u32 b = (u32)x / cols, j = (u32)x % cols;
    const u32 i0 = b * TP_BLOCK, i1 = min(i0 + TP_BLOCK, rows);
    float *sx = s + x * r;
    for (u32 k0 = 0; k0 < r; k0 += CHUNK) {
      const u32 rem = min(r - k0, (u32)CHUNK);
      if (rem > 4) tp_pass<8>(sx, m, i0, i1, cols, j, p, r, k0, rem);
      else if (rem > 2) tp_pass<4>(sx, m, i0, i1, cols, j, p, r, k0, rem);
      else if (rem > 1) tp_pass<2>(sx, m, i0, i1, cols, j, p, r, k0, rem);
      else tp_pass<1>(sx, m, i0, i1, cols, j, p, r, k0, rem);
    }
  }
}

// gc_lowrank_tp_sum is MulTP's second half for one matrix and Layout.Reduce's
// copy: element x of its Q (n = cols·r) is the sum, from +0, of the nb
// block sums s[b][x] in block order (CPU: MulTP's total t), written to
// qown[x] and vals2[x]. With the gate closed it writes vals2[x] = 0 only.
extern "C" __global__ void gc_lowrank_tp_sum(float *qown, float *vals2, const float *s, u32 nb, u64 n,
                                             const u32 *gate) {
  const bool go = gate_open(gate);
  FOR_EACH(x, n) {
    if (!go) {
      vals2[x] = 0.0f;
      continue;
    }
    float t = 0.0f;
    for (u32 b = 0; b < nb; b++) t = __fadd_rn(t, s[b * n + x]);
    qown[x] = t;
    vals2[x] = t;
  }
}

// gc_lowrank_decompose is Layout.Decode on one matrix (CPU: Decompose with
// res = m): a thread per element (i, j) writes out = Σ_k p[i][k]·(scale·
// qavg[j][k]) and m = m − Σ_k p[i][k]·qown[j][k], each sum starting from its
// k = 0 product, every product and sum rounded. The threads of row 0 read
// all of qavg (the summed Q) and report a NaN or ±Inf there to status[0]
// at index off (the matrix's first element; the value is the least such
// element's bits). With the gate closed out becomes a quiet NaN and m is
// left alone.
extern "C" __global__ void gc_lowrank_decompose(float *out, float *m, const float *p, const float *qavg,
                                                const float *qown, u32 rows, u32 cols, u32 r, float scale, u64 off,
                                                u64 *status, const u32 *gate) {
  const bool go = gate_open(gate);
  const u64 n = (u64)rows * cols;
  FOR_EACH(x, n) {
    if (!go) {
      out[x] = __uint_as_float(QNAN_BITS);
      continue;
    }
    const u32 i = (u32)x / cols, j = (u32)x % cols;
    const float *pi = p + (u64)i * r, *qa = qavg + (u64)j * r, *qo = qown + (u64)j * r;
    float a = __fmul_rn(pi[0], __fmul_rn(scale, qa[0]));
    float o = __fmul_rn(pi[0], qo[0]);
    for (u32 k = 1; k < r; k++) {
      a = __fadd_rn(a, __fmul_rn(pi[k], __fmul_rn(scale, qa[k])));
      o = __fadd_rn(o, __fmul_rn(pi[k], qo[k]));
    }
    out[x] = a;
    m[x] = __fsub_rn(m[x], o);
    if (i == 0) {
      for (u32 k = 0; k < r; k++)
        if (nonfinite(qa[k])) report(status, off, qa[k]);
    }
  }
}

// gc_lowrank_flat is Layout.Decode on one uncompressed range of n elements
// from bucket element off: the sums in vals1 (sum) are averaged in place,
// v / float32(ranks) rounded once (for a power-of-two ranks the same bits
// as compress.Average's v·(1/ranks); v itself for one rank), out gets the
// average, m zero, and a NaN or ±Inf average is reported to status[0] at
// its bucket index. With the gate closed out becomes a quiet NaN and sum
// and m are left alone.
extern "C" __global__ void gc_lowrank_flat(float *out, float *m, float *sum, u64 n, u32 ranks, u64 off, u64 *status,
                                           const u32 *gate) {
  const bool go = gate_open(gate);
  const float d = (float)ranks;
  FOR_EACH(i, n) {
    if (!go) {
      out[i] = __uint_as_float(QNAN_BITS);
      continue;
    }
    float v = sum[i];
    if (ranks > 1) v = __fdiv_rn(v, d);
    sum[i] = v;
    out[i] = v;
    m[i] = 0.0f;
    if (nonfinite(v)) report(status, off + i, v);
  }
}

// gc_lowrank_scale sets dst[i] = src[i]·c, rounded once, while the gate is
// open: LowRankEncode's copies of the uncompressed elements (c = 1: the
// gate vouches that they are finite, so the product is exact) and
// LowRankDecode's next warm start (c = 1/float32(ranks); CPU: v * inv).
extern "C" __global__ void gc_lowrank_scale(float *dst, const float *src, u64 n, float c, const u32 *gate) {
  if (!gate_open(gate)) return;
  FOR_EACH(i, n) dst[i] = __fmul_rn(src[i], c);
}
