package compress

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"testing"
)

// refSignBody is the sign codec's definition (see signCodec) written out
// element by element: the codec must produce these bytes.
func refSignBody(x []float32, bucket int) []byte {
	nb := (len(x) + bucket - 1) / bucket
	body := make([]byte, 4*nb+(len(x)+7)/8)
	for j := range nb {
		var acc [8]float64
		xs := x[j*bucket : min((j+1)*bucket, len(x))]
		for k, v := range xs {
			i := j*bucket + k
			acc[i%8] += math.Abs(float64(v))
			if v < 0 {
				body[4*nb+i/8] |= 1 << (i % 8)
			}
		}
		sum := ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
		binary.LittleEndian.PutUint32(body[4*j:], math.Float32bits(float32(sum/float64(len(xs)))))
	}
	return body
}

// TestSignRoundTrip checks the body against the definition byte for byte,
// each scale against the mean |x| within 1 ulp (what a backend summing in
// another order must meet), and each decoded value against ±scale.
func TestSignRoundTrip(t *testing.T) {
	for _, bucket := range []int{512, 13, 8, 1} {
		c := mustParse(t, fmt.Sprintf("sign:bucket=%d", bucket))
		for _, n := range append(testLengths(bucket), 1<<16+3) {
			for name, x := range testDistributions(n, 12) {
				name := fmt.Sprintf("bucket=%d/n=%d/%s", bucket, n, name)
				p, err := c.Compress(nil, x, Key{Step: uint64(n)})
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				body := payloadBody(p)
				if want := refSignBody(x, bucket); !bytes.Equal(body, want) {
					t.Fatalf("%s: body differs from the reference definition at byte %d", name, firstDiff(body, want))
				}
				dec := make([]float32, n)
				if err := c.Decompress(dec, p); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				for b := 0; b < n; b += bucket {
					xs := x[b:min(b+bucket, n)]
					scale := math.Float32frombits(binary.LittleEndian.Uint32(body[4*(b/bucket):]))
					checkSignScale(t, name, b/bucket, xs, scale)
					for k, v := range xs {
						want := scale
						if v < 0 {
							want = -scale
						}
						if got := dec[b+k]; math.Float32bits(got) != math.Float32bits(want) {
							t.Fatalf("%s: element %d = %v decodes to %v, want %v", name, b+k, v, got, want)
						}
					}
				}
			}
		}
	}
}

// checkSignScale compares a bucket's scale with mean |x| summed exactly
// enough (Kahan-Babuška in float64): they must be within 1 ulp.
func checkSignScale(t *testing.T, name string, j int, xs []float32, scale float32) {
	t.Helper()
	var sum, comp float64
	for _, v := range xs {
		a := math.Abs(float64(v))
		s := sum + a
		if math.Abs(sum) >= a {
			comp += (sum - s) + a
		} else {
			comp += (a - s) + sum
		}
		sum = s
	}
	want := float32((sum + comp) / float64(len(xs)))
	if scale != want && scale != math.Nextafter32(want, 0) && scale != math.Nextafter32(want, math.MaxFloat32) {
		t.Fatalf("%s: bucket %d scale %v, mean |x| is %v: more than 1 ulp apart", name, j, scale, want)
	}
}

// TestSignGolden pins the bytes of a fixed input (worked by hand: the sign
// bits LSB first, scales 4.5/8 = 0.5625 and 0.75/3 = 0.25).
func TestSignGolden(t *testing.T) {
	negZero := float32(math.Copysign(0, -1))
	x := []float32{-1, 0.5, negZero, 0, -0.25, 1, 0.75, -1, 0.25, -0.25, -0.25}
	p, err := mustParse(t, "sign:bucket=8").Compress(nil, x, Key{Bucket: 1, Step: 1})
	if err != nil {
		t.Fatal(err)
	}
	// bits: 1 0 0 0 1 0 0 1 → 0x91; 0 1 1 → 0x06
	if got, want := hex.EncodeToString(payloadBody(p)), "0000103f0000803e9106"; got != want {
		t.Errorf("body %s, want %s", got, want)
	}
}

// TestSignCorrupt: a scale that is negative, −0 or not finite, or a set
// padding bit, is a *CorruptInputError at its offset.
func TestSignCorrupt(t *testing.T) {
	c := mustParse(t, "sign")
	x := testDistributions(1029, 13)["normal"]
	valid, err := c.Compress(nil, x, Key{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		off  int
		bits uint32
	}{
		{"negative", 4, math.Float32bits(-0.5)},
		{"-0", 0, 0x80000000},
		{"Inf", 8, 0x7f800000},
		{"NaN", 4, 0x7fc00000},
	} {
		p := bytes.Clone(valid)
		binary.LittleEndian.PutUint32(p[HeaderLen+tc.off:], tc.bits)
		expectCorrupt(t, "sign/"+tc.name, c, p, HeaderLen+tc.off, len(x))
	}
	p := bytes.Clone(valid)
	p[len(p)-TrailerLen-1] |= 0x20 // 1029 = 128·8 + 5: bits 5-7 of the last byte are padding
	expectCorrupt(t, "sign/padding", c, p, len(p)-TrailerLen-1, len(x))
}
