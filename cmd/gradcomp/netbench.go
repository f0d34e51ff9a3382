package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/gradcomp/gradcomp/bench"
	"github.com/gradcomp/gradcomp/comm/mpi"
	"github.com/gradcomp/gradcomp/internal/outfile"
	"github.com/gradcomp/gradcomp/netbench"
	"github.com/gradcomp/gradcomp/overlap"
)

// netbenchDefaultCodecs are the compressed exchanges `gradcomp netbench`
// times by default.
const netbenchDefaultCodecs = "topk:0.01,int8,int4,randomk:0.01,sign"

// netbenchArgs are the parsed flags of "gradcomp netbench".
type netbenchArgs struct {
	cfg      netbench.Config
	jsonPath string // "" for none
}

// parseNetbench parses the flags of "gradcomp netbench". It returns the exit
// status to use when parsing ends the command (help: 0, usage error: 2,
// bad value: 1) and ok false then.
func parseNetbench(args []string, stderr io.Writer) (a netbenchArgs, code int, ok bool) {
	fs := flag.NewFlagSet("gradcomp netbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	link := fs.String("link", "local", "label of the link, copied into every result (scripts/netbench passes 1gbit, 10gbit, unlimited)")
	size := fs.String("size", "25000000", "gradient length in fp32 elements (see gradcomp bench -size): 25000000 is 100 MB")
	reps := fs.Int("reps", 5, "timed runs per case (the median is reported), after one warm-up")
	codecs := fs.String("codecs", netbenchDefaultCodecs, "comma-separated compressor specs to time against the dense all-reduce")
	strategies := fs.String("strategies", "auto", "comma-separated engine strategies per codec and decision: auto (the codec's flat exchange; on several nodes of several ranks, that or hier, whichever New's trial finds faster: its rows say auto:), hier (hierarchical: needs ranks on several nodes; it also gets a dense case, codec none pinned, when -codecs lacks one), or any overlap.ParseStrategy name")
	decisions := fs.String("decisions", netbench.Pinned+","+netbench.CostModel, "comma-separated decision modes per codec: pinned (always compress), cost-model (the engine may fall back to dense)")
	bucketMiB := fs.Float64("bucket-mib", 25, "largest bucket handed to the engine, in MiB of fp32")
	ef := fs.Bool("ef", true, "error-feedback memory on")
	nodeSpec := fs.String("node-spec", "", "codec of strategy hier's node stages (overlap.Config.NodeSpec): bf16, fp16, int8, or empty for float32")
	workers := fs.Int("workers", 0, "compressor goroutines per rank (0: this host's cores divided by the ranks on it)")
	probeMiB := fs.Float64("probe-mib", 64, "all-to-all bytes per rank, in MiB, of the link-rate probe, at most the gradient's size (0: no probe)")
	timeout := fs.Duration("timeout", 2*time.Minute, "bound on each collective and each exchange")
	seed := fs.Uint64("seed", 1, "seed of the synthetic gradients (rank r uses seed+r)")
	jsonPath := fs.String("json", filepath.Join("out", "netbench", "results.json"), "file that rank 0 merges its results into, replacing earlier rows of the same -link and layout (ranks, nodes) (\"\": none)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: mpirun -np N gradcomp netbench [flags]\n\n"+
			"Times, on every rank, a dense MPI all-reduce of a synthetic fp32 gradient\n"+
			"against each compressed exchange through the overlap engine, and prints the\n"+
			"speedups (rank 0). Needs a binary built with -tags mpi; scripts/netbench\n"+
			"runs it over emulated 1 and 10 Gbit/s links and plain loopback.\n\nflags:\n")
		fs.PrintDefaults()
	}
	if status, ok := parseFlags(fs, args, stderr); !ok {
		return a, status, false
	}
	bad := func(format string, v ...any) (netbenchArgs, int, bool) {
		fmt.Fprintf(stderr, "gradcomp netbench: "+format+"\n", v...)
		return a, 1, false
	}
	n, err := bench.ParseSize(*size)
	if err != nil {
		return bad("%v", err)
	}
	if *bucketMiB <= 0 || *probeMiB < 0 || *workers < 0 || *reps < 1 || *timeout <= 0 {
		return bad("-bucket-mib %g, -probe-mib %g, -workers %d, -reps %d, -timeout %v: want a positive bucket, reps and timeout and a probe and workers of 0 or more",
			*bucketMiB, *probeMiB, *workers, *reps, *timeout)
	}
	var cases []netbench.Case
	for _, d := range bench.SplitList(*decisions) {
		if d != netbench.Pinned && d != netbench.CostModel {
			return bad("-decisions: %q is not %s or %s", d, netbench.Pinned, netbench.CostModel)
		}
	}
	for _, st := range bench.SplitList(*strategies) {
		if _, err := overlap.ParseStrategy(st); err != nil {
			return bad("-strategies: %v", err)
		}
	}
	// Strategy hier gets a dense case ("none") even when -codecs names
	// none: its dense exchange against the baseline's flat ring is the
	// first thing to compare.
	if !slices.Contains(bench.SplitList(*codecs), "none") {
		for _, st := range bench.SplitList(*strategies) {
			if st == "hier" {
				cases = append(cases, netbench.Case{Codec: "none", Decision: netbench.Pinned, Strategy: st})
			}
		}
	}
	for _, c := range bench.SplitList(*codecs) {
		for _, d := range bench.SplitList(*decisions) {
			for _, st := range bench.SplitList(*strategies) {
				cases = append(cases, netbench.Case{Codec: c, Decision: d, Strategy: st})
			}
		}
	}
	w := *workers
	if w == 0 {
		w = max(1, runtime.NumCPU()/localRanks())
	}
	a = netbenchArgs{
		cfg: netbench.Config{
			Link: *link, Size: n, Reps: *reps, Seed: *seed, Cases: cases,
			BucketElems:   max(1, int(*bucketMiB*(1<<20)/4)),
			ErrorFeedback: *ef, Workers: w, NodeSpec: *nodeSpec,
			ProbeBytes: min(int(*probeMiB*(1<<20)), 4*n),
			Timeout:    *timeout,
		},
		jsonPath: *jsonPath,
	}
	return a, 0, true
}

// localRanks returns how many ranks of the job share this host, as mpirun
// tells its ranks (OMPI_COMM_WORLD_LOCAL_SIZE), or 1.
func localRanks() int {
	n, err := strconv.Atoi(os.Getenv("OMPI_COMM_WORLD_LOCAL_SIZE"))
	if err != nil || n < 1 {
		return 1
	}
	return n
}

// runNetbench is "gradcomp netbench": every rank measures; rank 0 prints
// the table and merges the results into -json.
func runNetbench(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a, code, ok := parseNetbench(args, stderr)
	if !ok {
		return code
	}
	c, err := mpi.Init()
	if errors.Is(err, mpi.ErrNotBuilt) {
		fmt.Fprintln(stderr, "gradcomp netbench: this binary was built without MPI. Build it with\n"+
			"  CGO_ENABLED=1 go build -tags mpi -o gradcomp ./cmd/gradcomp   (needs libopenmpi-dev, pkg-config)\n"+
			"and run it under mpirun, or run scripts/netbench, which builds it and sets up the emulated links.")
		return 1
	}
	if err != nil {
		fmt.Fprintf(stderr, "gradcomp netbench: %v\n", err)
		return 1
	}
	fail := func(err error) int {
		reportFailure(stderr, fmt.Sprintf("gradcomp netbench (rank %d)", c.Rank()), err)
		c.Abort(1)
		return 1
	}
	if c.Rank() == 0 {
		a.cfg.Progress = func(msg string) { fmt.Fprintf(stderr, "netbench %s: %s\n", a.cfg.Link, msg) }
	}
	results, err := netbench.Run(ctx, c, a.cfg)
	if err != nil {
		return fail(err)
	}
	if c.Rank() == 0 {
		if err := netbench.WriteTable(stdout, results); err != nil {
			return fail(err)
		}
		if a.jsonPath != "" {
			if err := mergeJSON(a.jsonPath, results); err != nil {
				return fail(err)
			}
		}
	}
	if err := c.Close(); err != nil {
		fmt.Fprintf(stderr, "gradcomp netbench (rank %d): %v\n", c.Rank(), err)
		return 1
	}
	return 0
}

// mergeJSON merges results into the JSON file at path (see netbench.Merge),
// creating it and its directory when missing.
func mergeJSON(path string, results []netbench.Result) error {
	old, err := readResults(path)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return outfile.Write(path, func(w io.Writer) error { return netbench.WriteJSON(w, netbench.Merge(old, results)) })
}

// readResults reads the results at path; a missing file holds none.
func readResults(path string) ([]netbench.Result, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	results, err := netbench.ReadJSON(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return results, nil
}
