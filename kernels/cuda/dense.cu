// fp32 ↔ fp16/bf16, the error-feedback sum and NaN/Inf detection.
// Reference: compress/dense.go (denseCodec, FP16FromFloat32, BF16FromFloat32).
#include "common.cuh"

// Formats of gc_dense_encode/decode.
#define FMT_F32 0
#define FMT_F16 1
#define FMT_BF16 2

// fp16_from_f32 is FP16FromFloat32 bit for bit: round to nearest even,
// ±Inf from 65520 up, a quiet NaN for NaN.
__device__ __forceinline__ u16 fp16_from_f32(float x) {
  const u32 f16max = (127u + 16) << 23, denorm_magic = ((127u - 15) + (23 - 10) + 1) << 23;
  u32 u = __float_as_uint(x);
  u16 sign = (u16)((u >> 16) & 0x8000);
  u &= 0x7fffffffu;
  if (u >= f16max) return u > 0x7f800000u ? sign | 0x7e00 : sign | 0x7c00;
  if (u < (113u << 23)) {
    float f = __fadd_rn(__uint_as_float(u), __uint_as_float(denorm_magic));
    return sign | (u16)(__float_as_uint(f) - denorm_magic);
  }
  u32 odd = (u >> 13) & 1;
  u = u - ((127u - 15) << 23) + 0xfff + odd;
  return sign | (u16)(u >> 13);
}

// f32_from_fp16 is Float32FromFP16: exact.
__device__ __forceinline__ float f32_from_fp16(u16 h) {
  u32 sign = (u32)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0) return __uint_as_float(__float_as_uint(__fmul_rn(__uint2float_rn(man), 5.9604644775390625e-08f)) | sign);
  if (exp == 0x1f) return __uint_as_float(sign | 0x7f800000u | man << 13);
  return __uint_as_float(sign | (exp + 127 - 15) << 23 | man << 13);
}

// bf16_from_f32 is BF16FromFloat32 bit for bit.
__device__ __forceinline__ u16 bf16_from_f32(float x) {
  u32 u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)(u >> 16) | 0x40;
  u += 0x7fff + ((u >> 16) & 1);
  return (u16)(u >> 16);
}

__device__ __forceinline__ float f32_from_bf16(u16 h) { return __uint_as_float((u32)h << 16); }

// gc_dense_encode writes the body of n elements (fp32, or fp16/bf16 rounded
// to nearest even) and, if eout is set, the residuals s − D(body). A NaN or
// ±Inf goes to status[0], a finite value the half format cannot hold to
// status[1]: the CPU reports the first non-finite value if there is one,
// else the first unrepresentable one. body is 4-byte aligned.
extern "C" __global__ void gc_dense_encode(u8 *body, const float *g, const float *e, float *eout, u64 n, u32 fmt,
                                           u64 *status) {
  FOR_EACH(i, n) {
    float x = gsum(g, e, i), d = x;
    if (nonfinite(x)) {
      report(&status[0], i, x);
      continue;
    }
    if (fmt == FMT_F32) {
      ((float *)body)[i] = x;
    } else if (fmt == FMT_F16) {
      u16 h = fp16_from_f32(x);
      if ((h & 0x7c00) == 0x7c00) report(&status[1], i, x);
      ((u16 *)body)[i] = h;
      d = f32_from_fp16(h);
    } else {
      u16 h = bf16_from_f32(x);
      if ((h & 0x7f80) == 0x7f80) report(&status[1], i, x);
      ((u16 *)body)[i] = h;
      d = f32_from_bf16(h);
    }
    if (eout) eout[i] = __fsub_rn(x, d);
  }
}

// gc_dense_decode sets (add == 0) or adds to (add == 1) dst the n values of
// a validated body.
extern "C" __global__ void gc_dense_decode(float *dst, const u8 *body, u64 n, u32 fmt, u32 add) {
  FOR_EACH(i, n) {
    float v = fmt == FMT_F32 ? ((const float *)body)[i]
              : fmt == FMT_F16 ? f32_from_fp16(((const u16 *)body)[i])
                               : f32_from_bf16(((const u16 *)body)[i]);
    dst[i] = add ? __fadd_rn(dst[i], v) : v;
  }
}

// gc_ef_add writes out[i] = e[i] + g[i] (out may be e: Retain) and reports
// the first non-finite sum to status if status is set.
extern "C" __global__ void gc_ef_add(float *out, const float *g, const float *e, u64 n, u64 *status) {
  FOR_EACH(i, n) {
    float s = __fadd_rn(e[i], g[i]);
    if (status && nonfinite(s)) report(status, i, s);
    out[i] = s;
  }
}

// gc_nonfinite reports the first NaN or ±Inf of x to status.
extern "C" __global__ void gc_nonfinite(const float *x, u64 n, u64 *status) {
  FOR_EACH(i, n) {
    float v = x[i];
    if (nonfinite(v)) report(status, i, v);
  }
}

// gc_fp16_from_f32 and the three below are the plain conversions (no
// checks), for callers that hold half-precision tensors.
extern "C" __global__ void gc_fp16_from_f32(u16 *dst, const float *src, u64 n) {
  FOR_EACH(i, n) dst[i] = fp16_from_f32(src[i]);
}
extern "C" __global__ void gc_f32_from_fp16(float *dst, const u16 *src, u64 n) {
  FOR_EACH(i, n) dst[i] = f32_from_fp16(src[i]);
}
extern "C" __global__ void gc_bf16_from_f32(u16 *dst, const float *src, u64 n) {
  FOR_EACH(i, n) dst[i] = bf16_from_f32(src[i]);
}
extern "C" __global__ void gc_f32_from_bf16(float *dst, const u16 *src, u64 n) {
  FOR_EACH(i, n) dst[i] = f32_from_bf16(src[i]);
}

// gc_fill_laplace fills x with Laplace(0, 1) samples from the DomainRound
// stream of base: benchmark and test inputs made on the device (the usual
// model of gradient magnitudes). logf is the accurate libdevice version.
extern "C" __global__ void gc_fill_laplace(float *x, u64 n, u64 base) {
  FOR_EACH(i, n) {
    u64 d = draw(base, i);
    float u = ((float)(d >> 40) + 0.5f) * 5.9604644775390625e-08f; // (0, 1)
    float m = -logf(u);
    x[i] = (d & 1) ? -m : m;
  }
}
