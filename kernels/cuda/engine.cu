// Kernels of the overlap engine on the device (overlap/device.go): the
// averaging step after an exchange. Reference: overlap's average (engine.go).
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
