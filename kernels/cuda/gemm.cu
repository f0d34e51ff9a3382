// A synthetic-compute kernel for the overlap benchmark: a plain tiled SGEMM
// standing in for backward's matrix products on the caller's stream. Not a
// fast GEMM (no tensor cores); it only has to keep the SMs busy the way
// backward does. Reference: C[i][j] = sum over l of A[i][l]·B[l][j],
// row-major, summed in l order with one rounding per product and per sum.
#include "common.cuh"

#define GT 16 // tile edge: 16×16 threads per block

// gc_sgemm computes c (m×n) = a (m×k) · b (k×n), row-major. Launched 1D:
// blocks of GT·GT threads, one block per GT×GT tile of c, tiles numbered
// row by row (ceil(n/GT) tiles per row).
extern "C" __global__ void gc_sgemm(float *c, const float *a, const float *b, u32 m, u32 n, u32 k) {
  __shared__ float as[GT][GT + 1], bs[GT][GT + 1];
  u32 tn = (n + GT - 1) / GT;
  u32 tx = threadIdx.x % GT, ty = threadIdx.x / GT;
  u32 row = (blockIdx.x / tn) * GT + ty, col = (blockIdx.x % tn) * GT + tx;
  float acc = 0.0f;
  for (u32 l0 = 0; l0 < k; l0 += GT) {
    as[ty][tx] = row < m && l0 + tx < k ? a[(u64)row * k + l0 + tx] : 0.0f;
    bs[ty][tx] = l0 + ty < k && col < n ? b[(u64)(l0 + ty) * n + col] : 0.0f;
    __syncthreads();
    for (u32 l = 0; l < GT; l++) acc = __fadd_rn(acc, __fmul_rn(as[ty][l], bs[l][tx]));
    __syncthreads();
  }
  if (row < m && col < n) c[(u64)row * n + col] = acc;
}
