package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/gradcomp/gradcomp/nccl"
)

// infoReport is what `gradcomp info` finds: the GPUs (through NVML), the
// layout the hierarchical exchange would use on them, and NCCL (through
// package nccl).
type infoReport struct {
	GPUs   gpuReport  `json:"gpus"`
	Layout string     `json:"layout"`
	NCCL   ncclReport `json:"nccl"`
}

// gpuReport describes the GPUs NVML sees. NoGPU says why there are none
// ("" when there are some).
type gpuReport struct {
	NoGPU      string      `json:"no_gpu,omitempty"`
	Driver     string      `json:"driver,omitempty"`      // NVIDIA driver version, e.g. "580.65.06"
	CUDADriver string      `json:"cuda_driver,omitempty"` // the CUDA version the driver supports, e.g. "13.0"
	Devices    []gpuDevice `json:"devices,omitempty"`
	// Topology[i][j] is the connection between GPUs i and j, as in
	// `nvidia-smi topo -m`: "X" (itself), "NV<k>" (k NVLinks, directly or
	// through NVSwitch), else the closest common PCIe ancestor: "PIX" (one
	// PCIe switch), "PXB" (several switches), "PHB" (a host bridge), "NODE"
	// (host bridges of one NUMA node), "SYS" (across NUMA nodes), "?"
	// (unknown).
	Topology [][]string `json:"topology,omitempty"`
}

// gpuDevice is one GPU. Fields NVML could not report are zero, with the
// reasons in Errors.
type gpuDevice struct {
	Index             int      `json:"index"`
	Name              string   `json:"name"`
	UUID              string   `json:"uuid"`
	PCIBusID          string   `json:"pci_bus_id"`
	MemoryTotal       uint64   `json:"memory_total_bytes"`
	MemoryFree        uint64   `json:"memory_free_bytes"`
	ComputeCapability string   `json:"compute_capability"` // "9.0" for an H200
	NVLinks           int      `json:"nvlinks_active"`
	Errors            []string `json:"errors,omitempty"`
}

// ncclReport is the NCCL library Open finds, or why none was found.
type ncclReport struct {
	Version string `json:"version,omitempty"`
	Path    string `json:"path,omitempty"`
	Source  string `json:"source,omitempty"` // how it was found (nccl.Library.Source)
	Error   string `json:"error,omitempty"`
}

// infoArgs are the parsed flags of `gradcomp info`.
type infoArgs struct {
	json     bool
	nvmlPath string
	ncclPath string
}

func parseInfo(args []string, stderr io.Writer) (a infoArgs, status int, ok bool) {
	fs := flag.NewFlagSet("info", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&a.json, "json", false, "print the report as JSON")
	fs.StringVar(&a.nvmlPath, "nvml", "libnvidia-ml.so.1", "the NVML library to load")
	fs.StringVar(&a.ncclPath, "nccl", "", "the NCCL library file (default: a copy already loaded, else $"+nccl.EnvPath+", else "+nccl.LibraryName+" on the search path)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: gradcomp info [flags]\n\n"+
			"Print the GPUs (name, memory, compute capability), the NVLink/PCIe topology\n"+
			"between them, the layout the hierarchical exchange would use, and the NCCL version. On a machine without a GPU or without\n"+
			"NCCL it says so and still exits 0.\n\nflags:")
		fs.PrintDefaults()
	}
	status, ok = parseFlags(fs, args, stderr)
	return a, status, ok
}

// runInfo is `gradcomp info`. It exits 0 whenever it could report, with or
// without GPUs and NCCL; 1 only when the report cannot be written.
func runInfo(_ context.Context, args []string, stdout, stderr io.Writer) int {
	a, status, ok := parseInfo(args, stderr)
	if !ok {
		return status
	}
	r := infoReport{GPUs: probeGPUs(a.nvmlPath), NCCL: probeNCCL(a.ncclPath)}
	r.Layout = layout(r.GPUs)
	var err error
	if a.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(r)
	} else {
		err = writeInfo(stdout, r)
	}
	if err != nil {
		return reportFailure(stderr, "gradcomp info", err)
	}
	return 0
}

// probeNCCL opens NCCL (from path when it is not empty) and reports it.
func probeNCCL(path string) ncclReport {
	var opts []nccl.LoadOption
	if path != "" {
		opts = append(opts, nccl.WithPath(path))
	}
	l, err := nccl.Open(opts...)
	if err != nil {
		return ncclReport{Error: err.Error()}
	}
	return ncclReport{Version: l.Version().String(), Path: l.Path(), Source: l.Source()}
}

// writeInfo writes r as text.
func writeInfo(w io.Writer, r infoReport) error {
	var b strings.Builder
	g := r.GPUs
	if g.NoGPU != "" {
		fmt.Fprintf(&b, "GPUs: none. %s\n", g.NoGPU)
	} else {
		fmt.Fprintf(&b, "GPUs: %d (NVIDIA driver %s, CUDA %s)\n", len(g.Devices), orUnknown(g.Driver), orUnknown(g.CUDADriver))
		for _, d := range g.Devices {
			fmt.Fprintf(&b, "  GPU %d: %s, %s memory (%s free), compute capability %s, %d NVLinks active, PCI %s, %s\n",
				d.Index, orUnknown(d.Name), gib(d.MemoryTotal), gib(d.MemoryFree), orUnknown(d.ComputeCapability),
				d.NVLinks, orUnknown(d.PCIBusID), orUnknown(d.UUID))
			for _, e := range d.Errors {
				fmt.Fprintf(&b, "    (%s)\n", e)
			}
		}
		if len(g.Devices) > 1 {
			b.WriteString("Topology (as nvidia-smi topo -m: NV<k> = k NVLinks; PIX/PXB = PCIe switch(es); PHB = host bridge; NODE = same NUMA node; SYS = across NUMA nodes):\n")
			tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
			for i := range g.Devices {
				fmt.Fprintf(tw, "\tGPU%d", i)
			}
			fmt.Fprintln(tw)
			for i, row := range g.Topology {
				fmt.Fprintf(tw, "  GPU%d\t%s\n", i, strings.Join(row, "\t"))
			}
			tw.Flush()
		}
	}
	fmt.Fprintf(&b, "Layout: %s\n", r.Layout)
	n := r.NCCL
	if n.Error != "" {
		fmt.Fprintf(&b, "NCCL: not available. %s\n", n.Error)
	} else {
		fmt.Fprintf(&b, "NCCL: %s (%s, %s)\n", n.Version, n.Path, n.Source)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// layout says how the hierarchical exchange (strategy hier) would place
// this machine: one rank per GPU, its node stages over the slowest link
// between two of them (by the nvidia-smi topology classes, from NVLink to
// across NUMA nodes).
func layout(g gpuReport) string {
	const where = "the ranks of a node are the processes sharing this host (MPI_COMM_TYPE_SHARED, torchrun's LOCAL_WORLD_SIZE)"
	switch len(g.Devices) {
	case 0:
		return "no GPU; " + where + ", the node stages run over shared memory"
	case 1:
		return "one rank per GPU: 1 rank per node, the hierarchical exchange has no node stage to run"
	}
	// The classes from the fastest link to the slowest.
	order := []string{"NV", "PIX", "PXB", "PHB", "NODE", "SYS", "?"}
	names := map[string]string{"NV": "NVLink", "PIX": "one PCIe switch", "PXB": "PCIe switches", "PHB": "a PCIe host bridge",
		"NODE": "PCIe host bridges of one NUMA node", "SYS": "the link between NUMA nodes", "?": "unknown links"}
	worst := 0
	for i, row := range g.Topology {
		for j, c := range row {
			if i == j {
				continue
			}
			k := slices.IndexFunc(order, func(p string) bool { return strings.HasPrefix(c, p) })
			if k < 0 {
				k = len(order) - 1
			}
			worst = max(worst, k)
		}
	}
	return fmt.Sprintf("one rank per GPU: %d ranks per node, whose node stages (reduce-scatter, all-gather) run over %s at worst; %s",
		len(g.Devices), names[order[worst]], where)
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// gib formats a byte count in GiB.
func gib(bytes uint64) string { return fmt.Sprintf("%.1f GiB", float64(bytes)/(1<<30)) }
