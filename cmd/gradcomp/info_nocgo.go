//go:build !cgo

package main

// probeGPUs reports that NVML cannot be loaded: github.com/NVIDIA/go-nvml
// needs cgo.
func probeGPUs(string) gpuReport {
	return gpuReport{NoGPU: "This gradcomp was built with CGO_ENABLED=0, so it cannot load NVML; rebuild with CGO_ENABLED=1 to see the GPUs."}
}
