package netbench

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func sampleResults() []Result {
	return []Result{
		{Strategy: "dense", Codec: "none", Decision: Baseline, Link: "1gbit", Seconds: 1.5, DenseSeconds: 1.5, Speedup: 1, Ranks: 4, Size: 25_000_000, Bytes: 100_000_000,
			BytesSent: 150_000_000, Buckets: 1, LinkGbps: 0.93, Runs: []float64{1.4, 1.5, 1.6}},
		{Strategy: "sparse-gather", Codec: "topk:0.01", Decision: Pinned, Link: "1gbit", Seconds: 0.15, DenseSeconds: 1.5, Speedup: 10, Ranks: 4, Size: 25_000_000, Bytes: 100_000_000,
			BytesSent: 6_000_000, Buckets: 4, Compressed: 4, CompressSeconds: 0.0625, ExchangeSeconds: 0.05, DecompressSeconds: 0.03, RelErr: 0.18, LinkGbps: 0.93, Runs: []float64{0.15, 0.14, 0.16}},
		{Strategy: "dense", Codec: "none", Decision: Baseline, Link: "unlimited", Seconds: 0.3, DenseSeconds: 0.3, Speedup: 1, Ranks: 4, Size: 25_000_000, Bytes: 100_000_000,
			BytesSent: 150_000_000, Buckets: 1, Runs: []float64{0.3}},
		{Strategy: "sra", Codec: "int8", Decision: CostModel, Link: "unlimited", Seconds: 0.31, DenseSeconds: 0.3007, Speedup: 0.97, Ranks: 4, Size: 25_000_000, Bytes: 100_000_000,
			BytesSent: 150_000_000, Buckets: 4, Reason: "dense 10ms < compressed 40ms", Runs: []float64{0.31}},
	}
}

func TestJSONRoundTrip(t *testing.T) {
	want := sampleResults()
	var buf bytes.Buffer
	if err := WriteJSON(&buf, want); err != nil {
		t.Fatal(err)
	}
	var objs []map[string]any
	if err := json.Unmarshal(buf.Bytes(), &objs); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"strategy", "codec", "link", "seconds", "speedup_vs_dense", "ranks", "size", "bytes", "bytes_sent", "decision", "runs", "compress_s", "exchange_s", "decompress_s", "dense_seconds", "nodes", "cross_node_bytes"} {
		if _, ok := objs[1][k]; !ok {
			t.Errorf("JSON object lacks %q: %v", k, objs[1])
		}
	}
	if objs[1]["speedup_vs_dense"] != 10.0 || objs[1]["link"] != "1gbit" {
		t.Errorf("JSON object: %v", objs[1])
	}
	got, err := ReadJSON(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got, want)
	}
	var empty bytes.Buffer
	if err := WriteJSON(&empty, nil); err != nil || strings.TrimSpace(empty.String()) != "[]" {
		t.Errorf("no results: %q, %v", empty.String(), err)
	}
	if _, err := ReadJSON(strings.NewReader(`[{"codec":"none","ratio":3}]`)); err == nil {
		t.Error("a foreign field was accepted")
	}
}

func TestMergeReplacesLinks(t *testing.T) {
	old := sampleResults()
	fresh := []Result{{Strategy: "dense", Codec: "none", Decision: Baseline, Link: "1gbit", Ranks: 4, Nodes: 4, Seconds: 2}}
	got := Merge(old, fresh)
	want := append(append([]Result(nil), old[2:]...), fresh...)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("merge:\n got %+v\nwant %+v", got, want)
	}
	if len(old) != 4 || old[0].Link != "1gbit" {
		t.Errorf("merge modified old: %+v", old)
	}
}

// TestMergeKeepsOtherLayouts: a run of 2 nodes × 2 ranks replaces the
// rows of that link and layout only, and those written before the layout
// was recorded (nodes 0).
func TestMergeKeepsOtherLayouts(t *testing.T) {
	old := []Result{
		{Codec: "none", Link: "1gbit", Ranks: 4, Nodes: 4},
		{Codec: "none", Link: "1gbit", Ranks: 4, Nodes: 2, Seconds: 1},
		{Codec: "none", Link: "1gbit", Ranks: 4},
		{Codec: "none", Link: "1gbit", Ranks: 8},
	}
	fresh := []Result{{Codec: "none", Link: "1gbit", Ranks: 4, Nodes: 2, Seconds: 2}}
	got := Merge(old, fresh)
	want := []Result{old[0], old[3], fresh[0]}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("merge:\n got %+v\nwant %+v", got, want)
	}
}

// TestWriteTableNodes: with several nodes the header names the layout and
// the rows gain the bytes across nodes; blocks are per link and layout.
func TestWriteTableNodes(t *testing.T) {
	rows := sampleResults()[:2]
	for i := range rows {
		rows[i].Nodes = 2
	}
	rows[0].CrossNodeBytes, rows[1].CrossNodeBytes = 75_120_000, 2_004_000
	one := sampleResults()[2]
	one.Nodes = 1
	var buf bytes.Buffer
	if err := WriteTable(&buf, append(rows, one)); err != nil {
		t.Fatal(err)
	}
	blocks := strings.Split(buf.String(), "\n\n")
	if len(blocks) != 2 {
		t.Fatalf("%d blocks, want 2:\n%s", len(blocks), buf.String())
	}
	for _, want := range []string{"2 nodes × 2 ranks", "across MB = bytes the node's interfaces sent per rank per run", "across MB", "75.12", "2.00"} {
		if !strings.Contains(blocks[0], want) {
			t.Errorf("2-node block lacks %q:\n%s", want, blocks[0])
		}
	}
	if strings.Contains(blocks[1], "across") || !strings.Contains(blocks[1], ", 4 ranks,") {
		t.Errorf("1-node block:\n%s", blocks[1])
	}
	buf.Reset()
	for i := range rows {
		rows[i].Nodes = 4
	}
	if err := WriteTable(&buf, rows); err != nil || !strings.Contains(buf.String(), ", 4 nodes × 1 rank, ") {
		t.Errorf("one rank per node (%v):\n%s", err, buf.String())
	}
}

func TestWriteTable(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteTable(&buf, sampleResults()); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	blocks := strings.Split(out, "\n\n")
	if len(blocks) != 2 {
		t.Fatalf("%d blocks, want one per link:\n%s", len(blocks), out)
	}
	for _, want := range []string{"# link 1gbit (probed 0.93 Gbit/s per rank), 4 ranks, 25000000 fp32 (100.0 MB), median of 3 runs", "sparse-gather", "topk:0.01", "1.5000", "10.00×", "4/4", "0.0625", "0.0500", "0.0300", "0.18"} {
		if !strings.Contains(blocks[0], want) {
			t.Errorf("first block lacks %q:\n%s", want, blocks[0])
		}
	}
	for _, want := range []string{"# link unlimited (not probed)", "cost-model", "0.3007", "0.97×", "0/4"} {
		if !strings.Contains(blocks[1], want) {
			t.Errorf("second block lacks %q:\n%s", want, blocks[1])
		}
	}
}
