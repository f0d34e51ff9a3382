package compress

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
)

// TestAverage compares Average with its definition, element by element
// dst[i] / float32(n), then the first non-finite index: bits and index.
func TestAverage(t *testing.T) {
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	for _, n := range []int{1, 2, 3, 4, 6, 8} {
		for _, bad := range [][]int{nil, {5}, {9, 2}, {0}, {11}} {
			x := make([]float32, 12)
			for i := range x {
				x[i] = float32(i*i-30) * 0.37
			}
			x[7] = math.MaxFloat32
			x[8] = math.SmallestNonzeroFloat32
			for j, i := range bad {
				x[i] = []float32{inf, nan}[j%2]
			}
			want := make([]float32, len(x))
			wantBad := -1
			for i, v := range x {
				want[i] = v / float32(n)
				if f := float64(want[i]); (math.IsNaN(f) || math.IsInf(f, 0)) && wantBad < 0 {
					wantBad = i
				}
			}
			got := append([]float32(nil), x...)
			gotBad := Average(got, n)
			what := fmt.Sprintf("n=%d, non-finite at %v", n, bad)
			if gotBad != wantBad {
				t.Errorf("%s: Average returned %d, want %d", what, gotBad, wantBad)
			}
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) && !(math.IsNaN(float64(got[i])) && math.IsNaN(float64(want[i]))) {
					t.Errorf("%s: element %d = %v, want %v", what, i, got[i], want[i])
				}
			}
		}
	}
}

// TestDecompressAverage: DecompressAverage equals clearing dst,
// DecompressAdd of each payload in turn and Average, bit for bit and in
// the index it returns, for every codec (over several blocks, with buckets
// that do not divide a block and one larger than a block, on one and two
// workers, and with sums that overflow where a codec carries the largest
// float); a bad payload is a *PayloadError with its index
// and leaves dst untouched.
func TestDecompressAverage(t *testing.T) {
	n := 3*decodeBlock + 1234
	for _, spec := range []string{"topk:0.01", "topk:0.3", "randomk:0.05", "int8", "int4:bucket=1000", "int2:bucket=3000", "sign", "sign:bucket=100", "fp16", "bf16", "none", "topk:0.02:lossless=zstd"} {
		for _, workers := range []int{1, 2} {
			for _, ranks := range []int{1, 3, 4} {
				name := fmt.Sprintf("%s/w=%d/N=%d", spec, workers, ranks)
				c := mustParse(t, spec, WithWorkers(workers), WithMinParallel(1))
				payloads := make([][]byte, ranks)
				for q := range payloads {
					x := make([]float32, n)
					for i := range x {
						x[i] = float32(math.Sin(float64(i*(q+3)))) * float32(1+i%17)
					}
					if q >= ranks-2 && overflows(spec) {
						x[2*decodeBlock+7] = math.MaxFloat32 // overflows the sum where kept
						x[decodeBlock+5] = math.MaxFloat32
					}
					var err error
					if payloads[q], err = c.Compress(nil, x, Key{Bucket: 1, Step: uint64(q)}); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
				}
				want := make([]float32, n)
				for q, p := range payloads {
					if err := c.DecompressAdd(want, p); err != nil {
						t.Fatalf("%s: DecompressAdd %d: %v", name, q, err)
					}
				}
				wantBad := Average(want, ranks)
				if overflows(spec) && ranks > 1 && wantBad != decodeBlock+5 {
					t.Fatalf("%s: the reference's first non-finite is %d, want the overflow at %d", name, wantBad, decodeBlock+5)
				}
				got := make([]float32, n)
				for i := range got {
					got[i] = 42
				}
				gotBad, err := DecompressAverage(c, got, payloads)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if gotBad != wantBad {
					t.Errorf("%s: first non-finite %d, want %d", name, gotBad, wantBad)
				}
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) && !(math.IsNaN(float64(got[i])) && math.IsNaN(float64(want[i]))) {
						t.Fatalf("%s: element %d = %v, want %v", name, i, got[i], want[i])
					}
				}

				bad := append([]byte(nil), payloads[ranks-1]...)
				bad[len(bad)-1] ^= 1
				before := append([]float32(nil), got...)
				_, err = DecompressAverage(c, got, append(payloads[:ranks-1:ranks-1], bad))
				var pe *PayloadError
				if !errors.As(err, &pe) || pe.Index != ranks-1 {
					t.Errorf("%s: corrupt last payload gave %v, want a *PayloadError for %d", name, err, ranks-1)
				}
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(before[i]) {
						t.Fatalf("%s: a corrupt payload changed element %d", name, i)
					}
				}
			}
		}
	}
	if _, err := DecompressAverage(mustParse(t, "int8"), make([]float32, 4), nil); err == nil {
		t.Error("no payloads: no error")
	}
}

// overflows reports whether spec carries math.MaxFloat32 into its payload
// (top-k keeps it, none sends it), so that TestDecompressAverage's sum of
// two such payloads overflows.
func overflows(spec string) bool { return strings.HasPrefix(spec, "topk") || spec == "none" }
