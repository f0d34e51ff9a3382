// Shared definitions of gradcomp's CUDA kernels. The semantics are those of
// package compress (the CPU reference); every comment "CPU:" names the Go
// code a line reproduces. Compiled with --fmad=false and without fast math,
// so each float operation below is one IEEE operation rounded to nearest
// even, as in Go; the intrinsics (__fadd_rn, __fmul_rn, __fsub_rn) make the
// bit-exact spots explicit regardless of flags.
#pragma once

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

#define GOLDEN 0x9e3779b97f4a7c15ULL
#define SIGN_MASK 0x7fffffffu
#define NONFINITE_KEY 0x7f800000u // key(+Inf); keys at or above are Inf or NaN
#define FLT_MAX_F 3.40282346638528859811704183484516925440e+38f

// mix64 is SplitMix64's finalizer (CPU: compress.mix64).
__device__ __forceinline__ u64 mix64(u64 z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// draw returns the 64-bit draw i of the stream whose base is base (CPU:
// RandomStream.Draw).
__device__ __forceinline__ u64 draw(u64 base, u64 i) { return mix64(base + (i + 1) * GOLDEN); }

// draw32 returns the 32-bit lane draw i of the stream whose base is base:
// lowbias32 of the Weyl sequence i·0x9e3779b9 + k0, k1 xored between its
// rounds, k0 and k1 the halves of base (CPU: RandomStream.Draw32, the
// definition in compress/rng.go; RandomStreamVersion "2").
__device__ __forceinline__ u32 draw32(u64 base, u32 i) {
  u32 x = i * 0x9e3779b9u + (u32)base;
  x = (x ^ (x >> 16)) * 0x7feb352du;
  x = (x ^ (x >> 15) ^ (u32)(base >> 32)) * 0x846ca68bu;
  return x ^ (x >> 16);
}

// key returns the magnitude key of x (CPU: magKey).
__device__ __forceinline__ u32 magkey(float x) { return __float_as_uint(x) & SIGN_MASK; }

// nonfinite reports whether x is NaN or ±Inf.
__device__ __forceinline__ bool nonfinite(float x) { return magkey(x) >= NONFINITE_KEY; }

// A status word records the lowest index of a failing element: kernels
// atomicMin (index<<32 | bits(value)) into it; ~0 means no failure. Indices
// are below 2^32 (compress.MaxElements).
__device__ __forceinline__ void report(u64 *status, u64 i, float v) {
  atomicMin(status, (i << 32) | (u64)__float_as_uint(v));
}

// gsum returns element i of the input a codec encodes: e[i] + g[i] rounded
// once when error feedback is on (e != 0; CPU: ErrorFeedback.Begin's r.sum),
// else g[i] unchanged (so −0 stays −0, as compress.Compress sees it).
__device__ __forceinline__ float gsum(const float *g, const float *e, u64 i) {
  return e ? __fadd_rn(e[i], g[i]) : g[i];
}

// Grid-stride loop over [0, n) with 64-bit indices.
#define FOR_EACH(i, n) \
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)

// block_min_max reduces lo (min) and hi (max) over the block; every thread
// gets the result. scratch holds 2·32 floats.
__device__ __forceinline__ void block_min_max(float &lo, float &hi, float *scratch) {
  for (int o = 16; o > 0; o >>= 1) {
    lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
    hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
  }
  int w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) {
    scratch[w] = lo;
    scratch[32 + w] = hi;
  }
  __syncthreads();
  lo = scratch[0];
  hi = scratch[32];
  for (int k = 1; k < nw; k++) {
    lo = fminf(lo, scratch[k]);
    hi = fmaxf(hi, scratch[32 + k]);
  }
  __syncthreads();
}

// block_min_u64 returns the least v over the block to every thread;
// scratch holds 32 u64.
__device__ __forceinline__ u64 block_min_u64(u64 v, u64 *scratch) {
  for (int o = 16; o > 0; o >>= 1) {
    u64 w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w < v ? w : v;
  }
  int nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  v = scratch[0];
  for (int k = 1; k < nw; k++) v = scratch[k] < v ? scratch[k] : v;
  __syncthreads();
  return v;
}

// block_scan returns the exclusive prefix sum of v over the block in thread
// order and sets *total to the block's sum (every thread). scratch holds 33
// u32. blockDim.x is a multiple of 32, at most 1024.
__device__ __forceinline__ u32 block_scan(u32 v, u32 *total, u32 *scratch) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  u32 x = v;
  for (int o = 1; o < 32; o <<= 1) {
    u32 y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();
  if (lane == 31) scratch[w] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    u32 s = 0;
    for (int k = 0; k < nw; k++) {
      u32 c = scratch[k];
      scratch[k] = s;
      s += c;
    }
    scratch[32] = s;
  }
  __syncthreads();
  u32 r = scratch[w] + x - v;
  *total = scratch[32];
  __syncthreads();
  return r;
}
