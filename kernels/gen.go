package kernels

// The PTX under ptx/ is generated from cuda/*.cu and committed; `make cuda`
// regenerates it and fails if it differs. Flags: compute_80 PTX (the driver
// JIT-compiles it for newer GPUs such as the H200), --fmad=false so no
// multiply-add is contracted, no fast math (IEEE division and sqrt), -lineinfo
// off so the PTX does not embed host paths.
//go:generate nvcc -ptx -arch=compute_80 --fmad=false -o ptx/dense.ptx cuda/dense.cu
//go:generate nvcc -ptx -arch=compute_80 --fmad=false -o ptx/quant.ptx cuda/quant.cu
//go:generate nvcc -ptx -arch=compute_80 --fmad=false -o ptx/topk.ptx cuda/topk.cu
//go:generate nvcc -ptx -arch=compute_80 --fmad=false -o ptx/engine.ptx cuda/engine.cu
//go:generate nvcc -ptx -arch=compute_80 --fmad=false -o ptx/gemm.ptx cuda/gemm.cu
//go:generate nvcc -ptx -arch=compute_80 --fmad=false -o ptx/lowrank.ptx cuda/lowrank.cu
