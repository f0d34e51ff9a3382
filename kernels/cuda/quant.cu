// Bucketed min-max quantization (int8/int4/int2) and sign, with optional
// fused error feedback, and the dequantize-accumulate of up to 8 payloads.
// Reference: compress/quant.go (quantCodec) and compress/sign.go (signCodec).
//
// Error feedback: with e != 0 the input is s = e + g and eout receives
// s − D(code), the residual a Commit installs (CPU: ErrorFeedback.Begin);
// e itself is never written, so a failed call leaves the memory untouched.
#include "common.cuh"

// quant_code returns min(trunc(float32(t + r)), L) with
// t = float32(float32(x − lo)·inv) and r = u·2^-24 (CPU: quantCode).
__device__ __forceinline__ u32 quant_code(float x, float lo, float inv, u32 u, u32 L) {
  float t = __fmul_rn(__fsub_rn(x, lo), inv);
  float r = __fmul_rn(__uint2float_rn(u), 5.9604644775390625e-08f); // 2^-24, exact
  u32 c = (u32)__float2int_rz(__fadd_rn(t, r));
  return c < L ? c : L;
}

// dequant returns lo + float32(float32(c)·scale) (CPU: dequant).
__device__ __forceinline__ float dequant(u32 c, float lo, float scale) {
  return __fadd_rn(lo, __fmul_rn(__uint2float_rn(c), scale));
}

// quant_range computes the bucket [start, end)'s parameters with the whole
// block (CPU: encodeRange up to the header write). It returns false, after
// reporting the failing element to status, for a bucket holding a NaN or
// ±Inf (the lowest such index) or whose range cannot be encoded (its first
// maximum). The result is the same in every thread.
__device__ bool quant_range(const float *g, const float *e, u64 start, u64 end, u32 L, u64 *status,
                            float &lo_out, float &scale_out, float &inv_out) {
  __shared__ float fs[64];
  __shared__ u64 us[32];
  float lo = __int_as_float(0x7f800000), hi = __int_as_float(0xff800000);
  u64 bad = ~0ULL;
  for (u64 i = start + threadIdx.x; i < end; i += blockDim.x) {
    float x = gsum(g, e, i);
    if (nonfinite(x)) {
      u64 p = (i << 32) | __float_as_uint(x);
      bad = p < bad ? p : bad;
    } else {
      lo = fminf(lo, x);
      hi = fmaxf(hi, x);
    }
  }
  bad = block_min_u64(bad, us);
  if (bad != ~0ULL) {
    if (threadIdx.x == 0) atomicMin(status, bad);
    return false;
  }
  block_min_max(lo, hi, fs);
  lo = __fadd_rn(lo, 0.0f); // −0 + +0 is +0
  hi = __fadd_rn(hi, 0.0f);
  double d = __dsub_rn((double)hi, (double)lo);
  float scale = __double2float_rn(__ddiv_rn(d, (double)L));
  float top = __fadd_rn(lo, __fmul_rn((float)L, scale));
  if (d > (double)FLT_MAX_F || nonfinite(top)) { // CPU: firstMaximum
    u64 first = ~0ULL;
    for (u64 i = start + threadIdx.x; i < end; i += blockDim.x) {
      float x = gsum(g, e, i);
      if (x == hi) {
        u64 p = (i << 32) | __float_as_uint(x);
        first = p < first ? p : first;
      }
    }
    first = block_min_u64(first, us);
    if (threadIdx.x == 0) atomicMin(status, first);
    return false;
  }
  float inv = 0.0f;
  if (scale != 0.0f) inv = __double2float_rn(fmin(__ddiv_rn((double)L, d), (double)FLT_MAX_F));
  lo_out = lo;
  scale_out = scale;
  inv_out = inv;
  return true;
}

// quant_byte returns code byte j (elements j·8/bits … of the LSB-first
// stream, those below n) and writes their residuals to eout if set. With
// per_elem the parameters come from hdr/invs by element bucket, else lo,
// scale and inv hold for every element of the byte.
template <bool per_elem>
__device__ __forceinline__ u8 quant_byte(u64 j, const float *g, const float *e, float *eout, u64 n, u32 B,
                                         u32 bits, u32 nearest, u64 base, const float *hdr, const float *invs,
                                         float lo, float scale, float inv) {
  u32 per = 8 / bits, L = (1u << bits) - 1;
  u64 i0 = j * per;
  u32 byte = 0;
  for (u32 q = 0; q < per; q++) {
    u64 i = i0 + q;
    if (i >= n) break;
    if (per_elem) {
      u64 b = i / B;
      lo = hdr[2 * b];
      scale = hdr[2 * b + 1];
      inv = invs[b];
    }
    float x = gsum(g, e, i);
    u32 u = nearest ? (1u << 23) : draw32(base, (u32)i) >> 8; // CPU: quantCodec.uniformBits
    u32 c = quant_code(x, lo, inv, u, L);
    byte |= c << (q * bits);
    if (eout) eout[i] = __fsub_rn(x, dequant(c, lo, scale));
  }
  return (u8)byte;
}

// gc_quant_encode writes the whole body (nb bucket headers (lo, scale), then
// the codes) of n elements in one pass, one block per bucket. It requires
// every bucket to start on a code byte boundary: B·bits a multiple of 8.
// body is 4-byte aligned; base is NewStream(seed, key, DomainRound)'s base.
extern "C" __global__ void gc_quant_encode(u8 *body, const float *g, const float *e, float *eout, u64 n, u32 B,
                                           u32 bits, u32 nearest, u64 base, u64 *status) {
  u64 nb = (n + B - 1) / B;
  float *hdr = (float *)body;
  u8 *codes = body + 8 * nb;
  u32 L = (1u << bits) - 1;
  for (u64 b = blockIdx.x; b < nb; b += gridDim.x) {
    u64 start = b * B, end = min(start + B, n);
    float lo, scale, inv;
    if (!quant_range(g, e, start, end, L, status, lo, scale, inv)) continue;
    if (threadIdx.x == 0) {
      hdr[2 * b] = lo;
      hdr[2 * b + 1] = scale;
    }
    for (u64 j = start * bits / 8 + threadIdx.x; j < (end * bits + 7) / 8; j += blockDim.x)
      codes[j] = quant_byte<false>(j, g, e, eout, n, B, bits, nearest, base, 0, 0, lo, scale, inv);
  }
}

// gc_quant_range is the first half of the two-kernel form, for buckets that
// share code bytes (B·bits not a multiple of 8): it writes the bucket
// headers, and each bucket's inv to invs (nb floats of scratch).
extern "C" __global__ void gc_quant_range(u8 *body, const float *g, const float *e, float *invs, u64 n, u32 B,
                                          u32 bits, u64 *status) {
  u64 nb = (n + B - 1) / B;
  float *hdr = (float *)body;
  for (u64 b = blockIdx.x; b < nb; b += gridDim.x) {
    u64 start = b * B, end = min(start + B, n);
    float lo, scale, inv;
    if (!quant_range(g, e, start, end, (1u << bits) - 1, status, lo, scale, inv)) continue;
    if (threadIdx.x == 0) {
      hdr[2 * b] = lo;
      hdr[2 * b + 1] = scale;
      invs[b] = inv;
    }
  }
}

// gc_quant_codes is the second half: one thread per code byte.
extern "C" __global__ void gc_quant_codes(u8 *body, const float *g, const float *e, float *eout, const float *invs,
                                          u64 n, u32 B, u32 bits, u32 nearest, u64 base) {
  u64 nb = (n + B - 1) / B;
  const float *hdr = (const float *)body;
  u8 *codes = body + 8 * nb;
  FOR_EACH(j, (n * bits + 7) / 8) {
    codes[j] = quant_byte<true>(j, g, e, eout, n, B, bits, nearest, base, hdr, invs, 0, 0, 0);
  }
}

#define SIGN_TILE 2048 // elements a sign_scale block stages at a time

// gc_sign_scale writes the nb bucket scales of a sign body, one block (256
// threads) per bucket, in the CPU's exact float64 summation order:
// acc[k] sums |x_i| over the bucket's i with i mod 8 == k in increasing i,
// then ((acc0+acc1)+(acc2+acc3))+((acc4+acc5)+(acc6+acc7)), divided by the
// bucket length (CPU: signBucket).
extern "C" __global__ void gc_sign_scale(u8 *body, const float *g, const float *e, u64 n, u32 B, u64 *status) {
  __shared__ float tile[SIGN_TILE];
  __shared__ double accs[8];
  __shared__ u64 us[32];
  u64 nb = (n + B - 1) / B;
  float *hdr = (float *)body;
  for (u64 b = blockIdx.x; b < nb; b += gridDim.x) {
    u64 start = b * B, end = min(start + B, n);
    double acc = 0.0;
    u64 bad = ~0ULL;
    for (u64 ts = start; ts < end; ts += SIGN_TILE) {
      u64 te = min(ts + SIGN_TILE, end);
      for (u64 i = ts + threadIdx.x; i < te; i += blockDim.x) {
        float x = gsum(g, e, i);
        if (nonfinite(x)) {
          u64 p = (i << 32) | __float_as_uint(x);
          bad = p < bad ? p : bad;
        }
        tile[i - ts] = fabsf(x);
      }
      __syncthreads();
      if (threadIdx.x < 8) {
        u64 k = threadIdx.x;
        for (u64 i = ts + ((k + 8 - ts % 8) % 8); i < te; i += 8) acc = __dadd_rn(acc, (double)tile[i - ts]);
      }
      __syncthreads();
    }
    bad = block_min_u64(bad, us);
    if (bad != ~0ULL) {
      if (threadIdx.x == 0) atomicMin(status, bad);
      continue;
    }
    if (threadIdx.x < 8) accs[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
      double sum = __dadd_rn(__dadd_rn(__dadd_rn(accs[0], accs[1]), __dadd_rn(accs[2], accs[3])),
                             __dadd_rn(__dadd_rn(accs[4], accs[5]), __dadd_rn(accs[6], accs[7])));
      hdr[b] = __double2float_rn(__ddiv_rn(sum, (double)(end - start)));
    }
    __syncthreads();
  }
}

// signed_scale returns the float32 with bits sb, negated if bit is 1 (CPU: signed).
__device__ __forceinline__ float signed_scale(u32 sb, u32 bit) { return __uint_as_float(sb | (bit << 31)); }

// gc_sign_bits writes the sign bits (bit 1 iff x < 0; −0 gives 0) after the
// scales, one thread per byte, and the residuals s − (±scale) to eout if
// set. It runs after gc_sign_scale on the same stream.
extern "C" __global__ void gc_sign_bits(u8 *body, const float *g, const float *e, float *eout, u64 n, u32 B) {
  u64 nb = (n + B - 1) / B;
  const u32 *hdr = (const u32 *)body;
  u8 *bits = body + 4 * nb;
  FOR_EACH(j, (n + 7) / 8) {
    u32 byte = 0;
    for (u32 q = 0; q < 8; q++) {
      u64 i = j * 8 + q;
      if (i >= n) break;
      float x = gsum(g, e, i);
      u32 bit = __float_as_uint(x) > 0x80000000u ? 1u : 0u;
      byte |= bit << q;
      if (eout) eout[i] = __fsub_rn(x, signed_scale(hdr[i / B], bit));
    }
    bits[j] = (u8)byte;
  }
}

// gc_dequant decodes up to 8 bodies of the same bucketed codec (bits 8, 4 or
// 2: min-max; bits 1: sign) and n elements into dst: dst[i] = D0 + D1 + …
// (add == 0) or dst[i] + D0 + D1 + … (add == 1), summed in float32 in payload
// order, which is what Decompress of p0 followed by DecompressAdd of the
// others computes. Bodies have passed compress's validation.
extern "C" __global__ void gc_dequant(float *dst, u64 n, u32 B, u32 bits, u32 add, u32 count, const u8 *p0,
                                      const u8 *p1, const u8 *p2, const u8 *p3, const u8 *p4, const u8 *p5,
                                      const u8 *p6, const u8 *p7) {
  u64 nb = (n + B - 1) / B;
  u32 mask = (1u << bits) - 1;
  u64 hstride = bits == 1 ? 1 : 2; // floats per bucket header
  FOR_EACH(i, n) {
    u64 b = i / B, off = i * bits;
    float acc = add ? dst[i] : 0.0f;
#pragma unroll
    for (u32 p = 0; p < 8; p++) {
      if (p >= count) break;
      const u8 *body = p == 0 ? p0 : p == 1 ? p1 : p == 2 ? p2 : p == 3 ? p3 : p == 4 ? p4 : p == 5 ? p5 : p == 6 ? p6 : p7;
      const float *hdr = (const float *)body;
      u32 c = (body[hstride * 4 * nb + (off >> 3)] >> (off & 7)) & mask;
      float v = bits == 1 ? signed_scale(__float_as_uint(hdr[b]), c) : dequant(c, hdr[2 * b], hdr[2 * b + 1]);
      acc = (p == 0 && !add) ? v : __fadd_rn(acc, v);
    }
    dst[i] = acc;
  }
}
