// Top-k by radix select (exact, AIR top-k style, and the sampled-threshold
// shortcut), random-k gather, and the sparse scatter both decode with.
// Reference: compress/topk.go, topk_select.go, randomk.go.
//
// Keys are bits(x) & 0x7fffffff; the selected set is every element with
// key > T (T the k-th largest key) plus the lowest-index elements with
// key == T, as many as make k. The 31 key bits are digits of 11, 11 and 9
// bits, most significant first. The output (k ascending uint32 indices, then
// the k float32 values) is byte-identical to the CPU's for both forms.
//
// The input is cut into tiles of TILE elements. A collect pass copies, per
// tile and in index order, the indices of the elements at or above a bound
// into the tile's slot of a candidate array (TILE uint32 per tile, so the
// workspace is 4 bytes per input element); the later levels and the output
// read only the candidates. Exact: histogram of digit 0 over the input (pass
// 1), collect key ≥ digit0<<20 with the digit-1 histogram (pass 2), digit 2
// and the output over the candidates: two passes over the input. Sampled: a
// threshold from a fixed sample (gc_topk_sample), one collect pass over the
// input (the only one), then every digit over the candidates; when fewer
// than k or more than limit were collected, gc_topk_check switches the state
// to exact mode and the exact kernels, launched guarded behind it, run
// instead. No kernel waits on the host: the mode lives in device memory.
#include "common.cuh"

#define TILE 4096       // input elements per tile
#define TILE_THREADS 256 // threads of the tile kernels (8 warps of 512 elements)
#define BINS 2048       // the widest digit

// Modes (TopkState.mode) and the guard masks kernels take.
#define MODE_SAMPLED 1u // the sampled candidates hold at least k
#define MODE_EXACT 2u

// TopkState is the device state of one selection (kernels/topk.go sizes it).
struct TopkState {
  u32 hist[3][BINS]; // per level histogram of the undecided keys' digit
  u32 mode;          // MODE_SAMPLED or MODE_EXACT
  u32 prefix;        // digits picked so far
  u32 need;          // elements still wanted from the undecided
  u32 found;         // candidates collected by the sampled collect
  u32 bound;         // the sampled collect's key bound
};

__constant__ u32 level_shift[3] = {20, 9, 0};
__constant__ u32 level_bits[3] = {11, 11, 9};

__device__ __forceinline__ u32 digit(u32 key, u32 l) { return (key >> level_shift[l]) & ((1u << level_bits[l]) - 1); }

// undecided reports whether key agrees with the digits picked before level l.
__device__ __forceinline__ bool undecided(u32 key, u32 l, u32 prefix) {
  return l == 0 || (key >> (level_shift[l - 1])) == prefix;
}

// select_bin finds, with the whole block, the bin of hist[0, nbins) holding
// the need-th largest count from the top (CPU: selection.pick) and returns
// it to thread 0 with *need reduced by the counts above it. scratch holds
// blockDim.x u32; nbins is a multiple of blockDim.x or smaller than it.
__device__ void select_bin(const u32 *hist, u32 nbins, u32 *need, u32 *bin, u32 *scratch) {
  u32 per = (nbins + blockDim.x - 1) / blockDim.x, lo = threadIdx.x * per;
  u32 sum = 0;
  for (u32 b = lo; b < lo + per && b < nbins; b++) sum += hist[b];
  scratch[threadIdx.x] = sum;
  __syncthreads();
  // Suffix sums: scratch[t] = Σ_{t' ≥ t} sums (Hillis–Steele).
  for (u32 o = 1; o < blockDim.x; o <<= 1) {
    u32 v = threadIdx.x + o < blockDim.x ? scratch[threadIdx.x + o] : 0;
    __syncthreads();
    scratch[threadIdx.x] += v;
    __syncthreads();
  }
  u32 above = scratch[threadIdx.x] - sum, want = *need;
  __syncthreads();
  if (above < want && want <= above + sum) {
    u32 b = min(lo + per, nbins) - 1;
    for (; above + hist[b] < want; b--) above += hist[b];
    *bin = b;
    *need = want - above;
  }
  __syncthreads();
}

// gc_topk_init resets the state: mode, need = k, empty histograms.
extern "C" __global__ void gc_topk_init(TopkState *st, u32 mode, u32 k) {
  for (u32 i = threadIdx.x; i < 3 * BINS; i += blockDim.x) (&st->hist[0][0])[i] = 0;
  if (threadIdx.x == 0) {
    st->mode = mode;
    st->prefix = 0;
    st->need = k;
    st->found = 0;
    st->bound = 0;
  }
}

// gc_topk_select picks level l's bin from st->hist[l] (one block of 256).
extern "C" __global__ void gc_topk_select(TopkState *st, u32 l, u32 mask) {
  __shared__ u32 scratch[1024];
  __shared__ u32 bin, need;
  if (!(st->mode & mask)) return;
  if (threadIdx.x == 0) need = st->need;
  __syncthreads();
  select_bin(st->hist[l], 1u << level_bits[l], &need, &bin, scratch);
  if (threadIdx.x == 0) {
    st->prefix = (st->prefix << level_bits[l]) | bin;
    st->need = need;
  }
}

// gc_topk_sample sets st->bound to the r-th largest key of the sample (1024
// runs of 64 elements, run j at ⌊j·n/1024⌋), capped at the +Inf key, with
// one block of 1024 threads (CPU: topkScratch.sampled).
extern "C" __global__ void gc_topk_sample(TopkState *st, const float *x, u64 n, u32 r) {
  __shared__ u32 hist[BINS];
  __shared__ u32 scratch[1024];
  __shared__ u32 bin, need;
  if (threadIdx.x == 0) need = r;
  u32 prefix = 0;
  for (u32 l = 0; l < 3; l++) {
    for (u32 b = threadIdx.x; b < BINS; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    for (u32 s = threadIdx.x; s < 1024 * 64; s += blockDim.x) {
      u64 i = (u64)(s / 64) * n / 1024 + s % 64;
      u32 key = magkey(x[i]);
      if (undecided(key, l, prefix)) atomicAdd(&hist[digit(key, l)], 1u);
    }
    __syncthreads();
    select_bin(hist, 1u << level_bits[l], &need, &bin, scratch);
    prefix = (prefix << level_bits[l]) | bin;
    __syncthreads();
  }
  if (threadIdx.x == 0) st->bound = min(prefix, NONFINITE_KEY);
}

// gc_topk_hist_input counts digit 0 of every element into st->hist[0] and
// reports the first NaN or ±Inf to status (exact pass 1).
extern "C" __global__ void gc_topk_hist_input(TopkState *st, const float *x, u64 n, u64 *status, u32 mask) {
  __shared__ u32 hist[BINS];
  if (!(st->mode & mask)) return;
  for (u32 b = threadIdx.x; b < BINS; b += blockDim.x) hist[b] = 0;
  __syncthreads();
  FOR_EACH(i, n) {
    float v = x[i];
    u32 key = magkey(v);
    if (key >= NONFINITE_KEY) report(status, i, v);
    atomicAdd(&hist[key >> 20], 1u);
  }
  __syncthreads();
  for (u32 b = threadIdx.x; b < BINS; b += blockDim.x)
    if (hist[b]) atomicAdd(&st->hist[0][b], hist[b]);
}

// gc_topk_collect copies, per tile in index order, the indices of the
// elements with key ≥ the bound into cand (tile t's slot starts at t·TILE)
// and their count into count[t]; one block of 256 threads per tile. Level 0
// (sampled): the bound is st->bound, every collected key's digit 0 is
// counted, NaN and ±Inf (always collected) are reported, and st->found adds
// up the candidates. Level 1 (exact pass 2): the bound is st->prefix<<20
// and digit 1 of the undecided is counted.
extern "C" __global__ void gc_topk_collect(TopkState *st, const float *x, u64 n, u32 *cand, u32 *count,
                                           u64 *status, u32 l, u32 mask) {
  __shared__ u32 hist[BINS];
  __shared__ u32 wsum[TILE_THREADS / 32];
  if (!(st->mode & mask)) return;
  u32 bound = l == 0 ? st->bound : st->prefix << 20, prefix = st->prefix;
  u32 lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  u32 lt = (1u << lane) - 1;
  for (u32 b = threadIdx.x; b < BINS; b += blockDim.x) hist[b] = 0;
  __syncthreads();
  for (u64 t = blockIdx.x; t * TILE < n; t += gridDim.x) {
    u64 base = t * TILE + (u64)w * (TILE / (TILE_THREADS / 32));
    u32 masks[16], c = 0;
#pragma unroll
    for (u32 r = 0; r < 16; r++) {
      u64 i = base + r * 32 + lane;
      bool in = false;
      if (i < n) {
        float v = x[i];
        u32 key = magkey(v);
        in = key >= bound;
        if (in && undecided(key, l, prefix)) atomicAdd(&hist[digit(key, l)], 1u);
        if (l == 0 && key >= NONFINITE_KEY) report(status, i, v);
      }
      masks[r] = __ballot_sync(0xffffffffu, in);
      c += __popc(masks[r]);
    }
    if (lane == 0) wsum[w] = c;
    __syncthreads();
    u32 off = 0, total = 0;
    for (u32 k = 0; k < TILE_THREADS / 32; k++) {
      off += k < w ? wsum[k] : 0;
      total += wsum[k];
    }
    u32 *out = cand + t * TILE;
#pragma unroll
    for (u32 r = 0; r < 16; r++) {
      if (masks[r] >> lane & 1) out[off + __popc(masks[r] & lt)] = (u32)(base + r * 32 + lane);
      off += __popc(masks[r]);
    }
    if (threadIdx.x == 0) {
      count[t] = total;
      if (l == 0) atomicAdd(&st->found, total);
    }
    __syncthreads(); // wsum is rewritten by the next tile
  }
  __syncthreads();
  for (u32 b = threadIdx.x; b < BINS; b += blockDim.x)
    if (hist[b]) atomicAdd(&st->hist[l][b], hist[b]);
}

// gc_topk_check ends the sampled attempt: with fewer than k or more than
// limit candidates the state switches to exact mode (clean histograms,
// need = k). One block.
extern "C" __global__ void gc_topk_check(TopkState *st, u32 k, u64 limit) {
  bool fall = st->mode == MODE_SAMPLED && (st->found < k || st->found > limit);
  __syncthreads(); // every thread has read the mode before thread 0 changes it
  if (!fall) return;
  for (u32 b = threadIdx.x; b < BINS; b += blockDim.x) st->hist[0][b] = 0;
  if (threadIdx.x == 0) {
    st->mode = MODE_EXACT;
    st->need = k;
    st->prefix = 0;
  }
}

// gc_topk_cand_hist counts level l's digit of the undecided candidates into
// st->hist[l]; one block per tile.
extern "C" __global__ void gc_topk_cand_hist(TopkState *st, const float *x, u64 n, const u32 *cand,
                                             const u32 *count, u32 l, u32 mask) {
  __shared__ u32 hist[BINS];
  if (!(st->mode & mask)) return;
  u32 prefix = st->prefix;
  for (u32 b = threadIdx.x; b < BINS; b += blockDim.x) hist[b] = 0;
  __syncthreads();
  for (u64 t = blockIdx.x; t * TILE < n; t += gridDim.x) {
    u32 c = count[t];
    for (u32 p = threadIdx.x; p < c; p += blockDim.x) {
      u32 key = magkey(x[cand[t * TILE + p]]);
      if (undecided(key, l, prefix)) atomicAdd(&hist[digit(key, l)], 1u);
    }
  }
  __syncthreads();
  for (u32 b = threadIdx.x; b < (1u << level_bits[l]); b += blockDim.x)
    if (hist[b]) atomicAdd(&st->hist[l][b], hist[b]);
}

// gc_topk_count counts, per tile, the candidates with key above the
// threshold T = st->prefix (above[t]) and equal to it (equal[t]).
extern "C" __global__ void gc_topk_count(TopkState *st, const float *x, u64 n, const u32 *cand, const u32 *count,
                                         u32 *above, u32 *equal) {
  __shared__ u32 scratch[33];
  u32 T = st->prefix;
  for (u64 t = blockIdx.x; t * TILE < n; t += gridDim.x) {
    u32 c = count[t], a = 0, e = 0;
    for (u32 p = threadIdx.x; p < c; p += blockDim.x) {
      u32 key = magkey(x[cand[t * TILE + p]]);
      a += key > T;
      e += key == T;
    }
    u32 ta, te;
    block_scan(a, &ta, scratch);
    block_scan(e, &te, scratch);
    if (threadIdx.x == 0) {
      above[t] = ta;
      equal[t] = te;
    }
  }
}

// gc_topk_scan turns the per-tile counts into output offsets: tile t takes
// take[t] = clamp(need − Σ_{s<t} equal[s], 0, equal[t]) of its keys equal to
// T (the lowest indices first) and writes from offset[t] = Σ_{s<t} (above[s]
// + take[s]). One block of 1024 threads. take overwrites equal.
extern "C" __global__ void gc_topk_scan(TopkState *st, u64 tiles, const u32 *above, u32 *equal, u32 *offset) {
  __shared__ u32 scratch[33];
  u32 need = st->need, eqCarry = 0, offCarry = 0;
  for (u64 t0 = 0; t0 < tiles; t0 += blockDim.x) {
    u64 t = t0 + threadIdx.x;
    u32 a = t < tiles ? above[t] : 0, e = t < tiles ? equal[t] : 0, te, to;
    u32 eqBefore = eqCarry + block_scan(e, &te, scratch);
    u32 take = eqBefore >= need ? 0 : min(e, need - eqBefore);
    u32 off = offCarry + block_scan(a + take, &to, scratch);
    if (t < tiles) {
      equal[t] = take;
      offset[t] = off;
    }
    eqCarry += te;
    offCarry += to;
  }
}

// gc_topk_write writes the selection: idx (k uint32) and vals (k float32) in
// index order, and, if eout is set, zeroes eout at the selected indices
// (eout then holds s and becomes s − D(c); x may be eout). One block of 256
// threads per tile. Positions at or past k are never written (they cannot
// occur unless the state is inconsistent; the guard keeps memory safe).
extern "C" __global__ void gc_topk_write(TopkState *st, const float *x, u64 n, const u32 *cand,
                                         const u32 *count, const u32 *take, const u32 *offset, u32 *idx,
                                         float *vals, float *eout, u32 k) {
  __shared__ u32 scratch[33];
  u32 T = st->prefix;
  for (u64 t = blockIdx.x; t * TILE < n; t += gridDim.x) {
    u32 c = count[t], quota = take[t], out = offset[t], eqSeen = 0;
    for (u32 p0 = 0; p0 < c; p0 += blockDim.x) {
      u32 p = p0 + threadIdx.x, i = 0;
      float v = 0;
      u32 key = 0;
      if (p < c) {
        i = cand[t * TILE + p];
        v = x[i];
        key = magkey(v);
      }
      bool eq = p < c && key == T;
      u32 eqTotal, selTotal;
      u32 eqRank = eqSeen + block_scan(eq, &eqTotal, scratch);
      bool sel = p < c && (key > T || (eq && eqRank < quota));
      u32 pos = out + block_scan(sel, &selTotal, scratch);
      if (sel && pos < k) {
        idx[pos] = i;
        vals[pos] = v;
        if (eout) eout[i] = 0.0f;
      }
      eqSeen += eqTotal;
      out += selTotal;
    }
  }
}

// randomk_index returns the index random-k picks in stratum j of n elements
// in k strata (CPU: randomkIndex).
__device__ __forceinline__ u64 randomk_index(u64 base, u64 j, u64 n, u64 k) {
  u64 lo = j * n / k, width = (j + 1) * n / k - lo;
  return lo + (((draw(base, j) >> 32) * width) >> 32);
}

// gc_randomk_gather writes vals[j] = x[index of stratum j] for the k strata
// and, if eout is set, zeroes eout there (x may be eout). base is
// NewStream(seed, key, DomainRandomK)'s base. NaN/Inf detection is a
// separate pass over the whole input (gc_nonfinite or gc_ef_add).
extern "C" __global__ void gc_randomk_gather(float *vals, const float *x, float *eout, u64 n, u64 k, u64 base) {
  FOR_EACH(j, k) {
    u64 i = randomk_index(base, j, n, k);
    vals[j] = x[i];
    if (eout) eout[i] = 0.0f;
  }
}

// gc_sparse_scatter sets (add == 0; dst cleared beforehand) or adds to
// (add == 1) dst[index j] the value vals[j], j < k, where index j is idx[j]
// (top-k) or random-k's stratum pick when idx is null. Indices are distinct,
// so no two threads touch one element.
extern "C" __global__ void gc_sparse_scatter(float *dst, const u32 *idx, const float *vals, u64 n, u64 k, u64 base,
                                             u32 add) {
  FOR_EACH(j, k) {
    u64 i = idx ? idx[j] : randomk_index(base, j, n, k);
    dst[i] = add ? __fadd_rn(dst[i], vals[j]) : vals[j];
  }
}

// gc_sparse_mask zeroes u[index j], j < k, the indices a sparse payload
// sent (index j as in gc_sparse_scatter: idx[j] for top-k, random-k's
// stratum pick when idx is null): momentum factor masking (CPU:
// compress.Pending.CommitMasked). With gate set (two status words) it
// does nothing unless both words are ~0: the exchange the payload took
// part in succeeded.
extern "C" __global__ void gc_sparse_mask(float *u, const u32 *idx, u64 n, u64 k, u64 base, const u64 *gate) {
  if (gate && (gate[0] != ~0ULL || gate[1] != ~0ULL)) return;
  FOR_EACH(j, k) {
    u64 i = idx ? idx[j] : randomk_index(base, j, n, k);
    u[i] = 0.0f;
  }
}
