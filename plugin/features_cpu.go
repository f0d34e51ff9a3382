//go:build !cuda && !fakegpu

package main

// features is gc_features' value in libgradcomp.so: no CUDA.
const features = 0
