// Kernels of the overlap engine on the device (overlap/device.go): the
// averaging step after an exchange (reference: overlap's average,
// engine.go), momentum correction, the accuracy guard's measure and
// flush, and the decay of error-feedback memory.
#include "common.cuh"

// gc_average ends a bucket's exchange in place on dst (n float32, the sum
// over ranks): with count status blocks (16 bytes each, stride bytes apart
// from slots: the gathered payload slots, each starting with its rank's
// Encode status) it first looks for a rank whose status reports a failure.
// If one does, every element of dst becomes a quiet NaN (the gradient
// poisoned on every rank alike, so a NaN-checking optimizer skips the step)
// and out[1] receives that lowest rank's index. Otherwise dst[i] becomes
// dst[i] / ranks rounded once (CPU: x / float32(N)), and the first
// non-finite result is reported to out[0]. out (two status words) must be
// reset to ~0 before the launch.
extern "C" __global__ void gc_average(float *dst, u64 n, u32 ranks, const u8 *slots, u64 stride, u32 count,
                                      u64 *out) {
  __shared__ int bad;
  if (threadIdx.x == 0) {
    int b = -1;
    for (u32 r = 0; r < count; r++) {
      const u64 *s = (const u64 *)(slots + r * stride);
      if (s[0] != ~0ULL || s[1] != ~0ULL) {
        b = (int)r;
        break;
      }
    }
    bad = b;
    if (blockIdx.x == 0 && b >= 0) out[1] = (u64)b;
  }
  __syncthreads();
  const float d = (float)ranks;
  FOR_EACH(i, n) {
    float v;
    if (bad >= 0) {
      v = __uint_as_float(0x7fc00000u);
    } else {
      v = ranks == 1 ? dst[i] : __fdiv_rn(dst[i], d);
      if (nonfinite(v)) report(&out[0], i, v);
    }
    dst[i] = v;
  }
}

// gc_momentum is momentum correction's step on one bucket (CPU: overlap's
// momentumStep): v = m·u[i] + grad[i], each operation rounded once (no
// multiply-add contraction), written to grad[i] (the gradient exchanged)
// and to next[i] (the velocity the engine installs once the step
// succeeded); the first non-finite v is reported to status[0]. status
// (two status words) must be reset to ~0 before the launch.
extern "C" __global__ void gc_momentum(float *grad, const float *u, float *next, u64 n, float m, u64 *status) {
  FOR_EACH(i, n) {
    const float v = __fadd_rn(__fmul_rn(m, u[i]), grad[i]);
    grad[i] = v;
    next[i] = v;
    if (nonfinite(v)) report(&status[0], i, v);
  }
}

// gc_guard is the accuracy guard's ρ of one bucket (CPU: kernels.GuardRatio,
// the definition): one block of GUARD_THREADS threads; thread t sums, in
// float64, the squares of resid[i] and of grad[i] for i ≡ t (mod
// GUARD_THREADS) in increasing i, then the block halves its partial sums
// pairwise (a[t] += a[t + s] for s = GUARD_THREADS/2, ..., 1). ρ is 0 when
// the residual's sum is 0, else √E / √G (IEEE, so +Inf for G = 0). It is
// written as a float64, followed by a zero word, to each of count guard
// blocks stride bytes apart from dst. Every operation is one IEEE double
// operation (a float's square is exact in double), so the result is a
// function of the inputs alone.
#define GUARD_THREADS 256
extern "C" __global__ void gc_guard(const float *resid, const float *grad, u64 n, u8 *dst, u64 stride,
                                    u32 count) {
  __shared__ double se[GUARD_THREADS], sg[GUARD_THREADS];
  __shared__ double rho;
  const u32 t = threadIdx.x;
  double e = 0, g = 0;
  for (u64 i = t; i < n; i += GUARD_THREADS) {
    const double r = (double)resid[i], x = (double)grad[i];
    e = __dadd_rn(e, __dmul_rn(r, r));
    g = __dadd_rn(g, __dmul_rn(x, x));
  }
  se[t] = e;
  sg[t] = g;
  __syncthreads();
  for (u32 s = GUARD_THREADS / 2; s > 0; s >>= 1) {
    if (t < s) {
      se[t] = __dadd_rn(se[t], se[t + s]);
      sg[t] = __dadd_rn(sg[t], sg[t + s]);
    }
    __syncthreads();
  }
  if (t == 0) rho = se[0] == 0 ? 0.0 : __ddiv_rn(__dsqrt_rn(se[0]), __dsqrt_rn(sg[0]));
  __syncthreads();
  for (u32 r = t; r < count; r += GUARD_THREADS) {
    u64 *b = (u64 *)(dst + r * stride);
    b[0] = (u64)__double_as_longlong(rho);
    b[1] = 0;
  }
}

// gc_guard_max writes the largest ρ of count guard blocks (stride bytes
// apart from src; NaN ignored, 0 when there is none larger) to the guard
// block dst (CPU: the host engine's maxHeldBack). One thread.
extern "C" __global__ void gc_guard_max(const u8 *src, u64 stride, u32 count, u64 *dst) {
  if (threadIdx.x != 0) return;
  double m = 0;
  for (u32 r = 0; r < count; r++) {
    const double v = *(const double *)(src + r * stride);
    if (v > m) m = v;
  }
  dst[0] = (u64)__double_as_longlong(m);
  dst[1] = 0;
}

// gc_flush is the accuracy guard's flush of one bucket (CPU:
// compress.ErrorFeedback.Flush): grad[i] = resid[i] + grad[i] rounded once,
// the gradient the dense all-reduce sends, and out[i] = 0, the residual the
// engine installs if that step succeeds.
extern "C" __global__ void gc_flush(float *grad, const float *resid, float *out, u64 n) {
  FOR_EACH(i, n) {
    grad[i] = __fadd_rn(resid[i], grad[i]);
    out[i] = 0.0f;
  }
}

// gc_scale sets x[i] = x[i]·c rounded once (CPU: kernels.ScaleStep): the
// decay of the error-feedback residual an Encode wrote (overlap's
// Config.FeedbackDecay, c = float32(β)).
extern "C" __global__ void gc_scale(float *x, u64 n, float c) {
  FOR_EACH(i, n) x[i] = __fmul_rn(x[i], c);
}
