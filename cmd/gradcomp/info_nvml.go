//go:build cgo

package main

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// probeGPUs loads NVML from path and reports the GPUs.
func probeGPUs(path string) gpuReport {
	return collectGPUs(nvml.New(nvml.WithLibraryPath(path)), path)
}

// collectGPUs reports the GPUs lib sees; path names the library in
// messages. A machine without the library, the driver or devices gives a
// report with NoGPU set; per-device failures are recorded in the device.
// It calls only methods of lib and its devices, never NVML's package-level
// functions, so tests can hand it a mock.
func collectGPUs(lib nvml.Interface, path string) gpuReport {
	switch ret := lib.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return gpuReport{NoGPU: fmt.Sprintf("The NVML library (%s) is not installed, so no NVIDIA driver is: this machine has no usable NVIDIA GPU.", path)}
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return gpuReport{NoGPU: fmt.Sprintf("The NVIDIA kernel driver is not loaded (NVML, %s: %v): no GPU is usable.", path, ret)}
	default:
		return gpuReport{NoGPU: fmt.Sprintf("NVML (%s) failed to initialize: %v.", path, ret)}
	}
	defer lib.Shutdown()

	var r gpuReport
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		r.Driver = v
	}
	if v, ret := lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		r.CUDADriver = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return gpuReport{NoGPU: fmt.Sprintf("NVML could not count the devices: %v.", ret)}
	}
	if n == 0 {
		r.NoGPU = "NVML sees no NVIDIA devices."
		return r
	}
	devs := make([]nvml.Device, n)
	buses := make([]string, n)
	for i := range devs {
		d := gpuDevice{Index: i}
		fail := func(what string, ret nvml.Return) { d.Errors = append(d.Errors, fmt.Sprintf("%s: %v", what, ret)) }
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			fail("handle", ret)
			r.Devices = append(r.Devices, d)
			continue
		}
		devs[i] = dev
		if d.Name, ret = dev.GetName(); ret != nvml.SUCCESS {
			fail("name", ret)
		}
		if d.UUID, ret = dev.GetUUID(); ret != nvml.SUCCESS {
			fail("UUID", ret)
		}
		if pci, ret := dev.GetPciInfo(); ret == nvml.SUCCESS {
			d.PCIBusID = busID(pci)
		} else {
			fail("PCI info", ret)
		}
		buses[i] = d.PCIBusID
		if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
			d.MemoryTotal, d.MemoryFree = mem.Total, mem.Free
		} else {
			fail("memory", ret)
		}
		if major, minor, ret := dev.GetCudaComputeCapability(); ret == nvml.SUCCESS {
			d.ComputeCapability = fmt.Sprintf("%d.%d", major, minor)
		} else {
			fail("compute capability", ret)
		}
		r.Devices = append(r.Devices, d)
	}

	// NVLinks: active links per GPU, and direct links between GPU pairs
	// (a link whose remote end is another GPU's PCI bus id; on NVSwitch
	// systems the remote end is a switch, and P2P status tells instead).
	direct := make([][]int, n)
	for i, dev := range devs {
		direct[i] = make([]int, n)
		if dev == nil {
			continue
		}
		for link := range nvml.NVLINK_MAX_LINKS {
			state, ret := dev.GetNvLinkState(link)
			if ret != nvml.SUCCESS || state != nvml.FEATURE_ENABLED {
				continue
			}
			r.Devices[i].NVLinks++
			if remote, ret := dev.GetNvLinkRemotePciInfo(link); ret == nvml.SUCCESS {
				for j, b := range buses {
					if j != i && b != "" && b == busID(remote) {
						direct[i][j]++
					}
				}
			}
		}
	}
	r.Topology = make([][]string, n)
	for i := range devs {
		r.Topology[i] = make([]string, n)
		for j := range devs {
			r.Topology[i][j] = link(devs, r.Devices, direct, i, j)
		}
	}
	return r
}

// link labels the connection between GPUs i and j (see gpuReport.Topology).
func link(devs []nvml.Device, info []gpuDevice, direct [][]int, i, j int) string {
	switch {
	case i == j:
		return "X"
	case devs[i] == nil || devs[j] == nil:
		return "?"
	case direct[i][j] > 0:
		return fmt.Sprintf("NV%d", direct[i][j])
	}
	if info[i].NVLinks > 0 && info[j].NVLinks > 0 {
		if st, ret := devs[i].GetP2PStatus(devs[j], nvml.P2P_CAPS_INDEX_NVLINK); ret == nvml.SUCCESS && st == nvml.P2P_STATUS_OK {
			return fmt.Sprintf("NV%d", min(info[i].NVLinks, info[j].NVLinks))
		}
	}
	level, ret := devs[i].GetTopologyCommonAncestor(devs[j])
	if ret != nvml.SUCCESS {
		return "?"
	}
	switch level {
	case nvml.TOPOLOGY_INTERNAL:
		return "BOARD"
	case nvml.TOPOLOGY_SINGLE:
		return "PIX"
	case nvml.TOPOLOGY_MULTIPLE:
		return "PXB"
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return "PHB"
	case nvml.TOPOLOGY_NODE:
		return "NODE"
	case nvml.TOPOLOGY_SYSTEM:
		return "SYS"
	}
	return "?"
}

// busID returns the PCI bus id NVML reports ("00000000:18:00.0"), or one
// built from its fields when the string is empty.
func busID(p nvml.PciInfo) string {
	b := make([]byte, 0, len(p.BusId))
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	if len(b) > 0 {
		return string(b)
	}
	return fmt.Sprintf("%08x:%02x:%02x.0", p.Domain, p.Bus, p.Device)
}
