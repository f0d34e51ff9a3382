package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"path/filepath"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/inproc"
	"github.com/gradcomp/gradcomp/comm/mpi"
	"github.com/gradcomp/gradcomp/train"
)

// runTrain is "gradcomp train": it trains the demo MLP data-parallel once
// per scheme, prints the table (or the JSON with -json) to stdout, and
// writes results.json, results.csv, curves.csv, accuracy.png and loss.png
// under -out. With -mpi it is one rank of an Open MPI job and only rank 0
// prints and writes.
func runTrain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gradcomp train", flag.ContinueOnError)
	fs.SetOutput(stderr)
	def := train.DefaultConfig()
	ranks := fs.Int("ranks", 4, "in-process ranks (one goroutine each); ignored with -mpi")
	nodes := fs.Int("nodes", 1, "nodes the in-process ranks pretend to run on (rank r on node r/(ranks/nodes)), for @hier; ignored with -mpi")
	epochs := fs.Int("epochs", def.Epochs, "passes over the train set")
	schemes := fs.String("configs", train.DefaultSchemes, "comma-separated schemes: a compressor spec (see compress.Parse; or powersgd:R), then options: +ef for error feedback, +mc for momentum correction (SGD's momentum moves into the exchange), +ramp=N for a compression warm-up of N steps per phase (overlap.Ramp), +guard=G for the accuracy guard, +auto for the cost model's decisions (else every bucket is compressed), +node=SPEC for @hier's node stages (bf16, fp16, int8); then @STRATEGY to override the codec's exchange (dense, shared-index, sparse-gather, sra, allgather, hier, low-rank)")
	out := fs.String("out", filepath.Join("out", "train"), "directory for the reports (created)")
	seed := fs.Uint64("seed", def.Seed, "seed of the data, the initial weights and the shuffles")
	trainSize := fs.Int("train-size", def.TrainSize, "examples in the train set")
	testSize := fs.Int("test-size", def.TestSize, "examples in the test set")
	lr := fs.Float64("lr", def.LR, "peak learning rate (cosine decay to 0), the same for every scheme")
	asJSON := fs.Bool("json", false, "print the results as JSON instead of a table")
	useMPI := fs.Bool("mpi", false, "run as this process's rank of an Open MPI job (build with -tags mpi, start under mpirun)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: gradcomp train [flags]\n\n"+
			"Trains an MLP on generated 8×8 digits, data-parallel over N ranks whose gradients\n"+
			"are averaged through the overlap engine, once per scheme, and compares test\n"+
			"accuracy and loss per epoch, bytes sent and time per step. Defaults:\n  %s.\n"+
			"They take about a minute on 2 cores.\n\nflags:\n", def.Title(4))
		fs.PrintDefaults()
	}
	if status, ok := parseFlags(fs, args, stderr); !ok {
		return status
	}
	fail := func(err error) int { return reportFailure(stderr, "gradcomp train", err) }
	cfg := def
	cfg.Epochs, cfg.Seed, cfg.LR = *epochs, *seed, *lr
	cfg.TrainSize, cfg.TestSize = *trainSize, *testSize
	list, err := train.ParseSchemes(*schemes)
	if err != nil {
		return fail(err)
	}
	group, err := ranksOf(*useMPI, *ranks, *nodes)
	if err != nil {
		return fail(err)
	}
	defer func() {
		for _, c := range group {
			c.Close()
		}
	}()
	lead := group[0].Rank() == 0
	var progress func(done, total int)
	if lead {
		p := newProgress(stderr, "train")
		defer p.finish()
		progress = p.update
	}
	results, err := train.Compare(ctx, group, cfg, list, train.EngineExchanger, progress)
	if err != nil {
		return fail(err)
	}
	if !lead {
		return 0
	}
	if _, err := train.WriteReports(*out, results); err != nil {
		return fail(err)
	}
	if *asJSON {
		err = train.WriteJSON(stdout, results)
	} else {
		fmt.Fprintf(stdout, "# %s; files in %s\n", cfg.Title(group[0].Size()), *out)
		err = train.WriteTable(stdout, results)
	}
	if err != nil {
		return fail(err)
	}
	return 0
}

// ranksOf returns the ranks this process drives: n in-process ranks on
// nodes nodes, or with useMPI this process's rank of the MPI job.
func ranksOf(useMPI bool, n, nodes int) ([]comm.Comm, error) {
	if !useMPI {
		if nodes == 1 {
			return inproc.NewGroup(n)
		}
		if nodes < 1 || n < 1 || n%nodes != 0 {
			return nil, fmt.Errorf("-nodes %d: want a divisor of -ranks %d", nodes, n)
		}
		nodeOf := make([]int, n)
		for r := range nodeOf {
			nodeOf[r] = r / (n / nodes)
		}
		return inproc.NewNodeGroup(nodeOf)
	}
	c, err := mpi.Init()
	if err != nil {
		return nil, fmt.Errorf("-mpi: %w", err)
	}
	return []comm.Comm{c}, nil
}
