package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/gradcomp/gradcomp/bench"
	"github.com/gradcomp/gradcomp/internal/outfile"
)

// runBench is "gradcomp bench": it measures the compressor suite, prints
// the table (or the JSON with -json) to stdout, and writes results.csv,
// results.json and the PNG plots under -out.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gradcomp bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sizes := fs.String("size", bench.DefaultSizes, "comma-separated gradient sizes in elements: 1000, 64K, 16M, 2^20")
	codecs := fs.String("codecs", bench.DefaultCodecs, "comma-separated codec specs (see compress.Parse)")
	out := fs.String("out", filepath.Join("out", "bench"), "directory for results.csv, results.json and the plots (created)")
	asJSON := fs.Bool("json", false, "print the results as JSON instead of a table")
	workers := fs.Int("workers", 1, "goroutines per compress/decompress call and per memcpy")
	seed := fs.Uint64("seed", 1, "seed of the synthetic gradients")
	var dists []string
	for _, d := range bench.Distributions() {
		dists = append(dists, d.Name())
	}
	dist := fs.String("dist", dists[0], "distribution of the gradients: "+strings.Join(dists, ", "))
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: gradcomp bench [flags]\n\n"+
			"Measures each codec on a synthetic gradient of each size: compression ratio,\n"+
			"encode and decode-accumulate GB/s of fp32 (best of several rounds) against a\n"+
			"memcpy timed in the same rounds, relative L2 error, sampled top-k recall and\n"+
			"the lossless stage's gain and cost. The defaults take 10-20 s on 2 cores.\n\nflags:\n")
		fs.PrintDefaults()
	}
	if status, ok := parseFlags(fs, args, stderr); !ok {
		return status
	}
	fail := func(err error) int { return reportFailure(stderr, "gradcomp bench", err) }
	cfg := bench.Config{Codecs: bench.SplitList(*codecs), Seed: *seed, Workers: *workers}
	var err error
	if cfg.Sizes, err = bench.ParseSizes(*sizes); err != nil {
		return fail(err)
	}
	if cfg.Dist, err = bench.DistributionByName(*dist); err != nil {
		return fail(err)
	}
	if *workers < 1 {
		return fail(fmt.Errorf("-workers %d: need at least 1", *workers))
	}
	if _, err := bench.ParseCodecs(cfg.Codecs, *workers); err != nil {
		return fail(err)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return fail(err)
	}
	p := newProgress(stderr, "bench")
	cfg.Progress = p.update
	results, err := bench.Run(ctx, cfg)
	p.finish()
	if err != nil {
		return fail(err)
	}
	if err := writeResults(*out, results); err != nil {
		return fail(err)
	}
	if *asJSON {
		err = bench.WriteJSON(stdout, results)
	} else {
		fmt.Fprintf(stdout, "# dist %s, seed %d, workers %d; GB/s = 1e9 fp32 bytes/s, best of the rounds; files in %s\n",
			cfg.Dist.Name(), cfg.Seed, cfg.Workers, *out)
		err = bench.WriteTable(stdout, results)
	}
	if err != nil {
		return fail(err)
	}
	return 0
}

// writeResults writes results.csv, results.json and the plots into dir.
func writeResults(dir string, results []bench.Result) error {
	for _, f := range []struct {
		name  string
		write func(io.Writer, []bench.Result) error
	}{{"results.csv", bench.WriteCSV}, {"results.json", bench.WriteJSON}} {
		if err := outfile.Write(filepath.Join(dir, f.name), func(w io.Writer) error { return f.write(w, results) }); err != nil {
			return err
		}
	}
	_, err := bench.WritePlots(dir, results)
	return err
}
