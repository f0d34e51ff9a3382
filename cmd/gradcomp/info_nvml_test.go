//go:build cgo

package main

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// fakeGPU describes one GPU of a fake NVML.
type fakeGPU struct {
	bus     string
	links   []string // remote PCI bus id of each active NVLink
	nodeOf  int      // NUMA node, for the PCIe ancestor
	nameErr bool
}

// fakeNVML returns a mock NVML with the given GPUs. GPUs whose links go to
// the bus id "switch" reach each other through an NVSwitch (P2P over
// NVLink is OK between them).
func fakeNVML(gpus []fakeGPU) *mock.Interface {
	devs := make([]*mock.Device, len(gpus))
	index := func(d nvml.Device) int {
		for i, x := range devs {
			if nvml.Device(x) == d {
				return i
			}
		}
		return -1
	}
	pci := func(bus string) nvml.PciInfo {
		var p nvml.PciInfo
		for i := range len(bus) {
			p.BusId[i] = int8(bus[i])
		}
		return p
	}
	viaSwitch := func(i int) bool { return len(gpus[i].links) > 0 && gpus[i].links[0] == "switch" }
	for i, g := range gpus {
		devs[i] = &mock.Device{
			GetNameFunc: func() (string, nvml.Return) {
				if g.nameErr {
					return "", nvml.ERROR_UNKNOWN
				}
				return "NVIDIA H200", nvml.SUCCESS
			},
			GetUUIDFunc:    func() (string, nvml.Return) { return "GPU-" + g.bus, nvml.SUCCESS },
			GetPciInfoFunc: func() (nvml.PciInfo, nvml.Return) { return pci(g.bus), nvml.SUCCESS },
			GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
				return nvml.Memory{Total: 143771 << 20, Free: 143000 << 20}, nvml.SUCCESS
			},
			GetCudaComputeCapabilityFunc: func() (int, int, nvml.Return) { return 9, 0, nvml.SUCCESS },
			GetNvLinkStateFunc: func(l int) (nvml.EnableState, nvml.Return) {
				if l < len(g.links) {
					return nvml.FEATURE_ENABLED, nvml.SUCCESS
				}
				return nvml.FEATURE_DISABLED, nvml.ERROR_NOT_SUPPORTED
			},
			GetNvLinkRemotePciInfoFunc: func(l int) (nvml.PciInfo, nvml.Return) { return pci(g.links[l]), nvml.SUCCESS },
			GetP2PStatusFunc: func(d nvml.Device, c nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
				if c == nvml.P2P_CAPS_INDEX_NVLINK && viaSwitch(i) && viaSwitch(index(d)) {
					return nvml.P2P_STATUS_OK, nvml.SUCCESS
				}
				return nvml.P2P_STATUS_NOT_SUPPORTED, nvml.SUCCESS
			},
			GetTopologyCommonAncestorFunc: func(d nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
				if gpus[index(d)].nodeOf == g.nodeOf {
					return nvml.TOPOLOGY_NODE, nvml.SUCCESS
				}
				return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
			},
		}
	}
	return &mock.Interface{
		InitFunc:                       func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:                   func() nvml.Return { return nvml.SUCCESS },
		SystemGetDriverVersionFunc:     func() (string, nvml.Return) { return "580.65.06", nvml.SUCCESS },
		SystemGetCudaDriverVersionFunc: func() (int, nvml.Return) { return 13000, nvml.SUCCESS },
		DeviceGetCountFunc:             func() (int, nvml.Return) { return len(devs), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i < 0 || i >= len(devs) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return devs[i], nvml.SUCCESS
		},
	}
}

func TestCollectGPUs(t *testing.T) {
	// GPUs 0 and 1: two direct NVLinks between them, NUMA node 0.
	// GPUs 2 and 3: four links each into an NVSwitch, NUMA node 1.
	// GPU 4: PCIe only, node 1, and its name query fails.
	sw := []string{"switch", "switch", "switch", "switch"}
	lib := fakeNVML([]fakeGPU{
		{bus: "00000000:18:00.0", links: []string{"00000000:2A:00.0", "00000000:2A:00.0"}},
		{bus: "00000000:2A:00.0", links: []string{"00000000:18:00.0", "00000000:18:00.0"}},
		{bus: "00000000:9A:00.0", links: sw, nodeOf: 1},
		{bus: "00000000:AB:00.0", links: sw, nodeOf: 1},
		{bus: "00000000:BA:00.0", nodeOf: 1, nameErr: true},
	})
	r := collectGPUs(lib, "libnvidia-ml.so.1")
	if r.NoGPU != "" || r.Driver != "580.65.06" || r.CUDADriver != "13.0" || len(r.Devices) != 5 {
		t.Fatalf("report %+v", r)
	}
	want := [][]string{
		{"X", "NV2", "SYS", "SYS", "SYS"},
		{"NV2", "X", "SYS", "SYS", "SYS"},
		{"SYS", "SYS", "X", "NV4", "NODE"},
		{"SYS", "SYS", "NV4", "X", "NODE"},
		{"SYS", "SYS", "NODE", "NODE", "X"},
	}
	if !reflect.DeepEqual(r.Topology, want) {
		t.Errorf("topology\n%v\nwant\n%v", r.Topology, want)
	}
	d := r.Devices[2]
	if d.Name != "NVIDIA H200" || d.ComputeCapability != "9.0" || d.NVLinks != 4 || d.PCIBusID != "00000000:9A:00.0" ||
		d.MemoryTotal != 143771<<20 || d.UUID != "GPU-00000000:9A:00.0" {
		t.Errorf("device 2: %+v", d)
	}
	if e := r.Devices[4].Errors; len(e) != 1 || !strings.HasPrefix(e[0], "name: ") {
		t.Errorf("device 4 errors: %q", e)
	}

	var out bytes.Buffer
	if err := writeInfo(&out, infoReport{GPUs: r, Layout: layout(r), NCCL: ncclReport{Version: "2.27.3", Path: "/x/libnccl.so.2", Source: "already loaded"}}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		"GPUs: 5 (NVIDIA driver 580.65.06, CUDA 13.0)",
		"GPU 2: NVIDIA H200, 140.4 GiB memory (139.6 GiB free), compute capability 9.0, 4 NVLinks active, PCI 00000000:9A:00.0",
		"GPU 4: unknown,", "    (name: ", "  GPU2  SYS   SYS   X     NV4   NODE", "NCCL: 2.27.3 (/x/libnccl.so.2, already loaded)",
		"Layout: one rank per GPU: 5 ranks per node, whose node stages (reduce-scatter, all-gather) run over the link between NUMA nodes at worst",
	} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("missing %q in:\n%s", s, out.String())
		}
	}
}

func TestCollectGPUsNone(t *testing.T) {
	for _, c := range []struct {
		init  nvml.Return
		count int
		want  string
	}{
		{nvml.ERROR_LIBRARY_NOT_FOUND, 0, "The NVML library (libnvidia-ml.so.1) is not installed"},
		{nvml.ERROR_DRIVER_NOT_LOADED, 0, "The NVIDIA kernel driver is not loaded"},
		{nvml.ERROR_NO_PERMISSION, 0, "NVML (libnvidia-ml.so.1) failed to initialize"},
		{nvml.SUCCESS, 0, "NVML sees no NVIDIA devices."},
	} {
		lib := fakeNVML(nil)
		lib.InitFunc = func() nvml.Return { return c.init }
		r := collectGPUs(lib, "libnvidia-ml.so.1")
		if !strings.HasPrefix(r.NoGPU, c.want) || len(r.Devices) != 0 {
			t.Errorf("Init %v: NoGPU %q, want prefix %q", c.init, r.NoGPU, c.want)
		}
	}
}

// TestLayout: the layout line names the slowest link between two GPUs.
func TestLayout(t *testing.T) {
	for _, c := range []struct {
		topo [][]string
		want string
	}{
		{[][]string{{"X", "NV18"}, {"NV18", "X"}}, "2 ranks per node, whose node stages (reduce-scatter, all-gather) run over NVLink at worst"},
		{[][]string{{"X", "NV4", "PIX"}, {"NV4", "X", "PHB"}, {"PIX", "PHB", "X"}}, "3 ranks per node, whose node stages (reduce-scatter, all-gather) run over a PCIe host bridge at worst"},
		{[][]string{{"X"}}, "1 rank per node, the hierarchical exchange has no node stage"},
	} {
		g := gpuReport{Devices: make([]gpuDevice, len(c.topo)), Topology: c.topo}
		if got := layout(g); !strings.Contains(got, c.want) {
			t.Errorf("%v: %q, want %q in it", c.topo, got, c.want)
		}
	}
}
