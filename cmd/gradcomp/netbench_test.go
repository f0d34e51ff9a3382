package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/netbench"
)

func TestNetbenchFlags(t *testing.T) {
	var stderr bytes.Buffer
	a, code, ok := parseNetbench([]string{"-link", "1gbit", "-size", "1M", "-reps", "3", "-codecs", "topk:0.01, int4",
		"-decisions", "cost-model", "-bucket-mib", "1", "-workers", "2", "-probe-mib", "2", "-json", "x.json", "-ef=false"}, &stderr)
	if !ok || code != 0 {
		t.Fatalf("parse failed (%d): %s", code, stderr.String())
	}
	cfg := a.cfg
	want := []netbench.Case{{Codec: "topk:0.01", Decision: netbench.CostModel, Strategy: "auto"}, {Codec: "int4", Decision: netbench.CostModel, Strategy: "auto"}}
	if cfg.Link != "1gbit" || cfg.Size != 1<<20 || cfg.Reps != 3 || cfg.BucketElems != 1<<18 || cfg.Workers != 2 ||
		cfg.ProbeBytes != 2<<20 || cfg.ErrorFeedback || a.jsonPath != "x.json" || len(cfg.Cases) != 2 || cfg.Cases[0] != want[0] || cfg.Cases[1] != want[1] {
		t.Errorf("parsed %+v, json %q", cfg, a.jsonPath)
	}

	a, _, ok = parseNetbench([]string{"-codecs", "none,int8", "-decisions", "pinned", "-strategies", "auto,hier"}, &stderr)
	if !ok || len(a.cfg.Cases) != 4 || a.cfg.Cases[1] != (netbench.Case{Codec: "none", Decision: netbench.Pinned, Strategy: "hier"}) {
		t.Errorf("-strategies auto,hier: %+v (%s)", a.cfg.Cases, stderr.String())
	}
	a, _, ok = parseNetbench([]string{"-codecs", "int8", "-decisions", "pinned", "-strategies", "auto,hier"}, &stderr)
	if want := []netbench.Case{{Codec: "none", Decision: netbench.Pinned, Strategy: "hier"}, {Codec: "int8", Decision: netbench.Pinned, Strategy: "auto"},
		{Codec: "int8", Decision: netbench.Pinned, Strategy: "hier"}}; !ok || !slices.Equal(a.cfg.Cases, want) {
		t.Errorf("-codecs int8 -strategies auto,hier: %+v, want %+v, the dense hier case first (%s)", a.cfg.Cases, want, stderr.String())
	}
	if _, code, ok := parseNetbench([]string{"-strategies", "sideways"}, &stderr); ok || code != 1 {
		t.Errorf("-strategies sideways: ok %v, exit %d; want a refusal", ok, code)
	}

	a, _, ok = parseNetbench(nil, &stderr)
	if !ok || a.cfg.Size != 25_000_000 || len(a.cfg.Cases) != 10 || a.cfg.Workers < 1 || a.cfg.ProbeBytes != 64<<20 || !a.cfg.ErrorFeedback {
		t.Errorf("defaults: %+v", a.cfg)
	}
	a, _, _ = parseNetbench([]string{"-size", "1000"}, &stderr)
	if a.cfg.ProbeBytes != 4000 {
		t.Errorf("probe of %d bytes for a 4000-byte gradient, want it capped at the gradient", a.cfg.ProbeBytes)
	}

	t.Setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "64")
	if a, _, _ := parseNetbench(nil, &stderr); a.cfg.Workers != max(1, runtime.NumCPU()/64) {
		t.Errorf("64 local ranks: %d workers", a.cfg.Workers)
	}

	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"-h"}, 0},
		{[]string{"-nope"}, 2},
		{[]string{"stray"}, 2},
		{[]string{"-size", "0"}, 1},
		{[]string{"-reps", "0"}, 1},
		{[]string{"-bucket-mib", "0"}, 1},
		{[]string{"-decisions", "pinned,maybe"}, 1},
		{[]string{"-timeout", "-1s"}, 1},
	} {
		stderr.Reset()
		if _, code, ok := parseNetbench(c.args, &stderr); ok || code != c.code || stderr.Len() == 0 {
			t.Errorf("%q: ok %v, exit %d, stderr %q; want exit %d with a message", c.args, ok, code, stderr.String(), c.code)
		}
	}
}

func TestNetbenchMergesJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a", "results.json")
	first := []netbench.Result{{Codec: "none", Link: "1gbit", Seconds: 1}, {Codec: "none", Link: "unlimited", Seconds: 2}}
	if err := mergeJSON(path, first); err != nil {
		t.Fatal(err)
	}
	if err := mergeJSON(path, []netbench.Result{{Codec: "none", Link: "1gbit", Seconds: 3}}); err != nil {
		t.Fatal(err)
	}
	got, err := readResults(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Link != "unlimited" || got[1].Seconds != 3 {
		t.Errorf("merged: %+v", got)
	}
	if err := os.WriteFile(path, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := mergeJSON(path, first); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("merging into a foreign file: %v, want an error naming it", err)
	}
}

// TestNetbenchScript runs scripts/netbench end to end with a tiny gradient
// over all three links, as root with iproute2 and Open MPI.
func TestNetbenchScript(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the end-to-end run builds the MPI binary and starts three mpirun jobs")
	}
	skipUnlessNetbenchCanRun(t)
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	args := []string{"-out", out, "-timeout", "60", "--", "-size", "64K", "-reps", "2", "-probe-mib", "0.25", "-codecs", "topk:0.01,int8", "-decisions", "pinned", "-timeout", "20s"}
	runScript(ctx, t, args...)

	f, err := os.Open(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	results, err := netbench.ReadJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	links := map[string]int{}
	for _, r := range results {
		links[r.Link]++
		if r.Ranks != 4 || r.Size != 64<<10 || r.Seconds <= 0 || r.Speedup <= 0 || len(r.Runs) != 2 || r.LinkGbps <= 0 {
			t.Errorf("result %+v", r)
		}
	}
	for _, l := range []string{"1gbit", "10gbit", "unlimited"} {
		if links[l] != 3 {
			t.Errorf("link %s: %d results, want the baseline and 2 codecs (all: %v)", l, links[l], links)
		}
		table, err := os.ReadFile(filepath.Join(out, l+".txt"))
		if err != nil || !strings.Contains(string(table), "# link "+l) {
			t.Errorf("%s.txt: %v\n%s", l, err, table)
		}
	}
	// The script must leave no namespace behind.
	if ns, err := exec.Command("ip", "netns", "list").Output(); err != nil || strings.Contains(string(ns), "gcnb-") {
		t.Errorf("namespaces after the run (%v):\n%s", err, ns)
	}
}

// TestNetbenchScriptNodes runs scripts/netbench with 2 nodes × 2 ranks at
// 1 Gbit/s: the ranks of a namespace must report one node, every row the
// bytes that crossed between nodes, -strategies auto,hier must add the
// hierarchical rows, a dense one among them, and auto's rows say which
// shape New's trials kept (which one depends on the machine).
func TestNetbenchScriptNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the end-to-end run builds the MPI binary and starts an mpirun job")
	}
	skipUnlessNetbenchCanRun(t)
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	table := runScript(ctx, t, "-n", "4", "-nodes", "2", "-links", "1gbit", "-out", out, "-timeout", "90", "--",
		"-size", "256K", "-reps", "2", "-probe-mib", "0.25", "-codecs", "int8", "-decisions", "pinned", "-strategies", "auto,hier", "-timeout", "20s")
	if !strings.Contains(string(table), "2 nodes × 2 ranks") || !strings.Contains(string(table), "across MB") {
		t.Errorf("table lacks the layout or the bytes across nodes:\n%s", table)
	}
	f, err := os.Open(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	results, err := netbench.ReadJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range results {
		got = append(got, r.Strategy+" "+r.Codec)
		// Every exchange sends something across, at most the ring's 3/4
		// of the gradient per rank plus the TCP/IP headers.
		if r.Ranks != 4 || r.Nodes != 2 || r.CrossNodeBytes <= 0 || r.CrossNodeBytes > 0.8*float64(r.Bytes) {
			t.Errorf("%s %s: %d ranks on %d nodes, %.0f bytes across nodes per rank", r.Strategy, r.Codec, r.Ranks, r.Nodes, r.CrossNodeBytes)
		}
	}
	want := [][]string{{"dense none"}, {"hier none"}, {"auto:sra int8", "auto:hier int8"}, {"hier int8"}}
	if len(got) != len(want) {
		t.Fatalf("rows %q, want one of each of %q", got, want)
	}
	for i, row := range got {
		if !slices.Contains(want[i], row) {
			t.Errorf("row %d is %q, want one of %q", i, row, want[i])
		}
	}
	// -nodes must divide -n; the script refuses before building anything.
	cmd := exec.CommandContext(ctx, filepath.Join("..", "..", "scripts", "netbench"), "-n", "4", "-nodes", "3")
	if msg, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(msg), "-nodes 3: want a divisor of -n 4") {
		t.Errorf("-n 4 -nodes 3: %v\n%s", err, msg)
	}
}

// skipUnlessNetbenchCanRun skips t unless scripts/netbench can run here.
func skipUnlessNetbenchCanRun(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("scripts/netbench needs root (network namespaces, tc)")
	}
	for _, tool := range []string{"ip", "tc", "mpirun", "go", "flock"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("scripts/netbench needs %s: %v", tool, err)
		}
	}
	if err := exec.Command("ip", "netns", "list").Run(); err != nil {
		t.Skipf("network namespaces unavailable: %v", err)
	}
}

// runScript runs scripts/netbench with args, skipping t when another run
// holds the script's lock and failing it on any other error.
func runScript(ctx context.Context, t testing.TB, args ...string) []byte {
	t.Helper()
	cmd := exec.CommandContext(ctx, filepath.Join("..", "..", "scripts", "netbench"), args...)
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) && ee.ExitCode() == 75 {
		t.Skipf("another scripts/netbench is running:\n%s", out.Bytes())
	}
	if err != nil {
		t.Fatalf("scripts/netbench %s: %v\n%s", strings.Join(args, " "), err, out.Bytes())
	}
	return out.Bytes()
}

// BenchmarkNetbench runs scripts/netbench at full size (4 ranks, 100 MB
// fp32, every link) once per iteration and reports each case's speedup over
// the dense all-reduce as a metric named "×LINK/CODEC/DECISION". It takes
// several minutes: run it on its own, e.g.
//
//	go test ./cmd/gradcomp -run '^$' -bench Netbench -benchtime 1x
//
// GRADCOMP_NETBENCH_OUT keeps the results in that directory.
func BenchmarkNetbench(b *testing.B) {
	skipUnlessNetbenchCanRun(b)
	out := os.Getenv("GRADCOMP_NETBENCH_OUT")
	if out == "" {
		out = b.TempDir()
	}
	for b.Loop() {
		runScript(context.Background(), b, "-out", out)
	}
	f, err := os.Open(filepath.Join(out, "results.json"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	results, err := netbench.ReadJSON(f)
	if err != nil {
		b.Fatal(err)
	}
	for _, r := range results {
		b.ReportMetric(r.Speedup, "×"+r.Link+"/"+r.Codec+"/"+r.Decision)
	}
}
