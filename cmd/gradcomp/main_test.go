package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gradcomp/gradcomp/internal/imagetest"
)

// gradcomp runs the CLI in-process and returns its exit status and output.
func gradcomp(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// gradcompJSON runs a command that prints a JSON array with -json and saves
// results.json under dir; it fails the test unless the command exits 0 with
// nothing on stderr (progress stays off a terminal), and returns how many
// objects it printed and the saved file.
func gradcompJSON(t *testing.T, dir string, args ...string) (printed int, saved []byte) {
	t.Helper()
	code, stdout, stderr := gradcomp(t, args...)
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	if stderr != "" {
		t.Errorf("stderr is not empty off a terminal:\n%s", stderr)
	}
	var objs []map[string]any
	if err := json.Unmarshal([]byte(stdout), &objs); err != nil {
		t.Fatalf("stdout is not a JSON array: %v\n%s", err, stdout)
	}
	saved, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	return len(objs), saved
}

// checkPNGs fails the test for each of names under dir that is not a PNG.
func checkPNGs(t *testing.T, dir string, names ...string) {
	t.Helper()
	for _, name := range names {
		imagetest.CheckPNG(t, filepath.Join(dir, name), 1, 1)
	}
}

func TestBenchWritesReports(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nested", "out")
	printed, file := gradcompJSON(t, dir, "bench", "-size", "1000,2^12", "-codecs", "none, fp16,bf16:lossless=zstd", "-out", dir, "-json", "-seed", "3", "-dist", "laplace")
	var saved []map[string]any
	if err := json.Unmarshal(file, &saved); err != nil {
		t.Fatal(err)
	}
	if len(saved) != 6 || printed != 6 {
		t.Fatalf("%d results saved, %d printed; want 3 codecs × 2 sizes", len(saved), printed)
	}
	for i, o := range saved {
		for _, k := range []string{"codec", "size", "ratio", "encode_gbps", "decode_gbps", "encode_vs_memcpy", "rel_l2_error"} {
			if _, ok := o[k]; !ok {
				t.Errorf("result %d lacks %q: %v", i, k, o)
			}
		}
		if o["dist"] != "laplace" || o["workers"] != 1.0 {
			t.Errorf("result %d: dist %v, workers %v", i, o["dist"], o["workers"])
		}
		if _, ok := o["lossless_ratio_gain"]; ok != (o["codec"] == "bf16:lossless=zstd") {
			t.Errorf("result %d (%v): lossless_ratio_gain present = %v", i, o["codec"], ok)
		}
	}
	if saved[0]["codec"] != "none" || saved[0]["size"] != 1000.0 || saved[0]["rel_l2_error"] != 0.0 || saved[3]["size"] != 4096.0 {
		t.Errorf("first results: %v, %v", saved[0], saved[3])
	}
	csv, err := os.ReadFile(filepath.Join(dir, "results.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(string(csv), "\n"); lines != 7 || !strings.HasPrefix(string(csv), "codec,size,") {
		t.Errorf("results.csv has %d lines, want a header and 6 rows:\n%s", lines, csv)
	}
	checkPNGs(t, dir, "ratio_vs_error.png", "throughput_1000.png", "throughput_4K.png")
}

func TestBenchTable(t *testing.T) {
	code, stdout, stderr := gradcomp(t, "bench", "-size", "1K", "-codecs", "fp16", "-out", t.TempDir(), "-workers", "2")
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "workers 2") || !strings.HasPrefix(lines[1], "codec") || !strings.HasPrefix(lines[2], "fp16 ") {
		t.Errorf("table output:\n%s", stdout)
	}
}

func TestUsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		code int
		want []string // substrings of stderr
	}{
		{nil, 2, []string{"commands:", "bench"}},
		{[]string{"frobnicate"}, 2, []string{`unknown command "frobnicate"`, "bench"}},
		{[]string{"bench", "-nosuchflag"}, 2, []string{"-nosuchflag"}},
		{[]string{"bench", "stray"}, 2, []string{`unexpected argument "stray"`}},
		{[]string{"bench", "-size", "1M,lots"}, 1, []string{`"lots"`}},
		{[]string{"bench", "-dist", "cauchy"}, 1, []string{"cauchy", "mixture"}},
		{[]string{"bench", "-workers", "0"}, 1, []string{"-workers 0"}},
		// A codec this build lacks: the message names it and the valid names.
		{[]string{"bench", "-size", "10", "-codecs", "fp16,zfp:0.1"}, 1, []string{`unknown codec "zfp"`, "none", "fp16", "bf16"}},
	}
	for _, c := range cases {
		code, stdout, stderr := gradcomp(t, c.args...)
		if code != c.code || stdout != "" {
			t.Errorf("gradcomp %q: exit %d, stdout %q; want exit %d and no output", c.args, code, stdout, c.code)
		}
		for _, w := range c.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("gradcomp %q: stderr %q lacks %q", c.args, stderr, w)
			}
		}
	}
	if code, stdout, _ := gradcomp(t, "help"); code != 0 || !strings.Contains(stdout, "bench") {
		t.Errorf("gradcomp help: exit %d, stdout %q", code, stdout)
	}
	if code, _, stderr := gradcomp(t, "bench", "-h"); code != 0 || !strings.Contains(stderr, "-codecs") {
		t.Errorf("gradcomp bench -h: exit %d, stderr %q", code, stderr)
	}
}
