package bench

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"image/png"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/gradcomp/gradcomp/internal/imagetest"
)

func ptr(v float64) *float64 { return &v }

// sampleResults covers every optional field: plain, recall, lossless,
// failed, and two sizes.
func sampleResults() []Result {
	base := Result{Dist: "mixture", Workers: 1, Rounds: 3, MemcpyGBps: 9.5}
	rs := []Result{base, base, base, base, base}
	rs[0].Codec, rs[0].Size, rs[0].Ratio, rs[0].EncodeGBps, rs[0].DecodeGBps, rs[0].RelL2Error = "none", 1<<20, 0.99998, 8.1, 7.2, 0
	rs[1].Codec, rs[1].Size, rs[1].Ratio, rs[1].EncodeGBps, rs[1].DecodeGBps, rs[1].RelL2Error = "fp16", 1<<20, 1.99993, 1.5, 2.5, 2.8e-4
	rs[2].Codec, rs[2].Size, rs[2].Ratio, rs[2].EncodeGBps, rs[2].DecodeGBps, rs[2].RelL2Error = "topk:0.01:sampled", 1<<20, 49.9, 0.9, 3.3, 0.71
	rs[2].Recall = ptr(0.9731)
	rs[3].Codec, rs[3].Size, rs[3].Ratio, rs[3].EncodeGBps, rs[3].DecodeGBps, rs[3].RelL2Error = "fp16:lossless=zstd", 1000, 2.4, 0.3, 0.8, 1.0/3
	rs[3].Lossless, rs[3].LosslessRatioGain, rs[3].LosslessEncodeSlowdown = "zstd", ptr(1.21), ptr(4.5)
	rs[4] = Result{Codec: "fp16", Size: 1000, Dist: "mixture", Workers: 1, Error: "compress: non-finite or unrepresentable gradient value 1e+06 at index 3"}
	for i := range rs[:4] {
		rs[i].EncodeVsMemcpy = rs[i].EncodeGBps / rs[i].MemcpyGBps
		rs[i].PayloadBytes = int(float64(4*rs[i].Size) / rs[i].Ratio)
	}
	return rs
}

func TestWriteJSONRoundTrip(t *testing.T) {
	rs := sampleResults()
	var buf bytes.Buffer
	if err := WriteJSON(&buf, rs); err != nil {
		t.Fatal(err)
	}
	var back []Result
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, rs) {
		t.Fatalf("JSON round trip changed the results:\n got %+v\nwant %+v", back, rs)
	}
	// The schema: required fields always present, optional ones only where set.
	var objs []map[string]any
	if err := json.Unmarshal(buf.Bytes(), &objs); err != nil {
		t.Fatal(err)
	}
	for i, o := range objs {
		for _, k := range []string{"codec", "size", "ratio", "encode_gbps", "decode_gbps", "encode_vs_memcpy", "rel_l2_error"} {
			if _, ok := o[k]; !ok {
				t.Errorf("object %d lacks %q", i, k)
			}
		}
		if _, ok := o["recall"]; ok != (rs[i].Recall != nil) {
			t.Errorf("object %d (%s): recall present = %v", i, rs[i].Codec, ok)
		}
		if _, ok := o["lossless_ratio_gain"]; ok != (rs[i].LosslessRatioGain != nil) {
			t.Errorf("object %d (%s): lossless_ratio_gain present = %v", i, rs[i].Codec, ok)
		}
	}
	buf.Reset()
	if err := WriteJSON(&buf, nil); err != nil || strings.TrimSpace(buf.String()) != "[]" {
		t.Errorf("WriteJSON(nil) wrote %q, %v; want []", buf.String(), err)
	}
}

func TestWriteCSVRoundTrip(t *testing.T) {
	rs := sampleResults()
	var buf bytes.Buffer
	if err := WriteCSV(&buf, rs); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(rs)+1 {
		t.Fatalf("%d CSV rows, want a header and %d", len(rows), len(rs))
	}
	// Rebuild each result as a JSON object from the CSV cells, typed by
	// the JSON form of the original, and decode it through encoding/json.
	for i, r := range rs {
		orig, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var types map[string]any
		if err := json.Unmarshal(orig, &types); err != nil {
			t.Fatal(err)
		}
		obj := map[string]any{}
		for j, key := range rows[0] {
			cell := rows[i+1][j]
			switch types[key].(type) {
			case nil:
				if cell != "" {
					t.Errorf("row %d: %s = %q, want empty (absent from JSON)", i, key, cell)
				}
			case string:
				obj[key] = cell
			case float64:
				v, err := strconv.ParseFloat(cell, 64)
				if err != nil {
					t.Fatalf("row %d: %s = %q: %v", i, key, cell, err)
				}
				obj[key] = v
			}
		}
		js, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		var back Result
		if err := json.Unmarshal(js, &back); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(back, r) {
			t.Errorf("row %d: CSV gave %+v, want %+v", i, back, r)
		}
	}
}

func TestWriteTable(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteTable(&buf, sampleResults()); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(buf.String(), "\n"), "\n")
	if len(lines) != 6 {
		t.Fatalf("%d lines, want a header and 5 rows:\n%s", len(lines), buf.String())
	}
	for _, want := range []string{"codec", "ratio", "enc GB/s", "rel L2 err", "recall"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("header %q lacks %q", lines[0], want)
		}
	}
	if !strings.HasPrefix(lines[3], "topk:0.01:sampled ") || !strings.Contains(lines[3], "0.9731") || !strings.Contains(lines[3], " 1M ") {
		t.Errorf("sampled top-k row %q lacks its codec, size or recall", lines[3])
	}
	if !strings.Contains(lines[1], " - ") {
		t.Errorf("row %q: a missing recall should read -", lines[1])
	}
	if !strings.Contains(lines[5], "non-finite") {
		t.Errorf("failed row %q lacks its error", lines[5])
	}
	// Fixed width: the ratio column ends at the same offset on every line.
	end := strings.Index(lines[0], "ratio") + len("ratio")
	for _, l := range lines[1:5] {
		if l[end-1] == ' ' || l[end] != ' ' {
			t.Errorf("ratio column not right-aligned at %d:\n%s\n%s", end, lines[0], l)
		}
	}
}

func TestWritePlots(t *testing.T) {
	dir := t.TempDir()
	paths, err := WritePlots(dir, sampleResults())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"ratio_vs_error.png", "throughput_1M.png", "throughput_1000.png"}
	if len(paths) != len(want) {
		t.Fatalf("wrote %v, want %v", paths, want)
	}
	for i, p := range paths {
		if filepath.Base(p) != want[i] {
			t.Errorf("path %d is %s, want %s", i, p, want[i])
		}
		imagetest.CheckPNG(t, p, 300, 200)
	}
}

// TestPlotsDegenerate draws plots with nothing on the log axes (only exact
// or failed codecs) and with a single point.
func TestPlotsDegenerate(t *testing.T) {
	rs := sampleResults()
	for _, set := range [][]Result{{rs[0]}, {rs[4]}, {rs[1]}} {
		var buf bytes.Buffer
		if err := PlotRatioError(&buf, set); err != nil {
			t.Fatalf("%s: %v", set[0].Codec, err)
		}
		if _, err := png.Decode(&buf); err != nil {
			t.Fatalf("%s: %v", set[0].Codec, err)
		}
		buf.Reset()
		if err := PlotThroughput(&buf, set, set[0].Size); err != nil {
			t.Fatalf("%s: %v", set[0].Codec, err)
		}
	}
	if err := PlotThroughput(new(bytes.Buffer), rs, 12345); err == nil {
		t.Error("PlotThroughput of a size with no result did not fail")
	}
}

func TestPointLabels(t *testing.T) {
	rs := []Result{
		{Codec: "fp16", Size: 1, RelL2Error: 1e-4, Ratio: 2},
		{Codec: "fp16:lossless=zstd", Size: 1, RelL2Error: 1e-4, Ratio: 2.01}, // joins fp16's label
		{Codec: "int8", Size: 1, RelL2Error: 1e-2, Ratio: 4},
		{Codec: "fp16", Size: 2, RelL2Error: 1.2e-4, Ratio: 2},             // near its own label
		{Codec: "int8", Size: 2, RelL2Error: 1e-1, Ratio: 4},               // far: labelled again
		{Codec: "fp16:lossless=zstd", Size: 2, RelL2Error: 1e-4, Ratio: 2}, // already named there
	}
	want := []string{"fp16\nfp16:lossless=zstd", "", "int8", "", "int8", ""}
	if got := pointLabels(rs); !reflect.DeepEqual(got, want) {
		t.Errorf("pointLabels = %q, want %q", got, want)
	}
}

func TestWriteTableNoErrorColumn(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteTable(&buf, sampleResults()[:4]); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "error") {
		t.Errorf("table without a failed codec has an error column:\n%s", buf.String())
	}
}

// TestPlaceLabels puts three labels on nearby points and an obstacle: the
// chosen boxes must overlap neither each other nor the obstacle.
func TestPlaceLabels(t *testing.T) {
	l, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{}}, Labels: []string{""}})
	if err != nil {
		t.Fatal(err)
	}
	sty := l.TextStyle[0]
	pts := []vg.Point{{X: 100, Y: 100}, {X: 100, Y: 102}, {X: 101, Y: 98}}
	labels := []string{"topk:0.01", "topk:0.01:sampled", "int4\nint4:lossless=zstd"}
	wall := vg.Rectangle{Min: vg.Point{X: 103, Y: 0}, Max: vg.Point{X: 400, Y: 100}} // right-below is taken
	chosen := placeLabels(pts, labels, sty, []vg.Rectangle{wall})
	boxes := []vg.Rectangle{wall}
	for i, c := range chosen {
		b := placements[c].box(pts[i], sty.Width(labels[i]), sty.Height(labels[i]))
		for j, o := range boxes {
			if a := overlap(b, o); a > 0 {
				t.Errorf("label %q (placement %d) overlaps box %d by %v", labels[i], c, j, a)
			}
		}
		boxes = append(boxes, b)
	}
}
