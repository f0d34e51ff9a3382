package compress_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/gradcomp/gradcomp/compress"
)

// TestPayloadHooks checks that DecodePayload returns the raw body that
// EncodePayload frames back into the identical payload, for every codec and
// lossless stage, and that both refuse what Decompress refuses.
func TestPayloadHooks(t *testing.T) {
	x := make([]float32, 1000)
	for i := range x {
		x[i] = float32(i%37) - 18.25
	}
	key := compress.Key{Bucket: 4, Step: 9}
	for _, spec := range []string{"none", "fp16:lossless=huff0", "bf16", "topk:0.05:lossless=zstd", "randomk:0.1:seed=3", "int8", "int4:bucket=100", "int2:bucket=33:round=nearest", "sign:lossless=huff0"} {
		c, err := compress.Parse(spec)
		if err != nil {
			t.Fatal(err)
		}
		p, err := c.Compress(nil, x, key)
		if err != nil {
			t.Fatal(err)
		}
		h, body, err := compress.DecodePayload(c, p, len(x))
		if err != nil {
			t.Fatalf("%s: DecodePayload: %v", spec, err)
		}
		if h.Codec != c.Codec() || h.Elements != len(x) || h.Key != key {
			t.Errorf("%s: header %+v", spec, h)
		}
		raw := append([]byte(nil), body...)
		q, err := compress.EncodePayload(c, []byte("pre"), len(x), key, func(b []byte) error {
			if len(b) != len(raw) {
				t.Errorf("%s: fill gets %d bytes, the raw body has %d", spec, len(b), len(raw))
			}
			copy(b, raw)
			return nil
		})
		if err != nil || !bytes.Equal(q[3:], p) || string(q[:3]) != "pre" {
			t.Errorf("%s: EncodePayload of the decoded body does not give the payload back (err %v)", spec, err)
		}
		if _, _, err := compress.DecodePayload(c, p, len(x)+1); err == nil {
			t.Errorf("%s: DecodePayload accepted a wrong element count", spec)
		}
		bad := append([]byte(nil), p...)
		bad[len(bad)/2] ^= 1
		if _, _, err := compress.DecodePayload(c, bad, len(x)); err == nil {
			t.Errorf("%s: DecodePayload accepted a corrupted payload", spec)
		}
	}
}

// TestPayloadHooksErrors checks the hooks' own failures: a fill error comes
// back as is with dst unchanged, and a foreign Compressor is refused.
func TestPayloadHooksErrors(t *testing.T) {
	c, _ := compress.Parse("int8")
	boom := errors.New("boom")
	dst := []byte("keep")
	out, err := compress.EncodePayload(c, dst, 10, compress.Key{}, func([]byte) error { return boom })
	if !errors.Is(err, boom) || string(out) != "keep" {
		t.Errorf("EncodePayload with a failing fill: %q, %v", out, err)
	}
	if _, err := compress.EncodePayload(c, nil, -1, compress.Key{}, func([]byte) error { return nil }); err == nil {
		t.Error("EncodePayload accepted a negative element count")
	}
	var foreign struct{ compress.Compressor }
	if _, err := compress.EncodePayload(foreign, nil, 1, compress.Key{}, func([]byte) error { return nil }); err == nil {
		t.Error("EncodePayload accepted a Compressor not made by Parse")
	}
	if _, _, err := compress.DecodePayload(foreign, nil, 1); err == nil {
		t.Error("DecodePayload accepted a Compressor not made by Parse")
	}
}

// TestStreamBase checks StreamBase against the definition in rng.go: draw i
// is mix64(base + (i+1)·golden), and draw32 takes its keys k0 and k1 from
// the low and high halves of base.
func TestStreamBase(t *testing.T) {
	mix64 := func(z uint64) uint64 {
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		return z ^ z>>31
	}
	key := compress.Key{Bucket: 2, Step: 3}
	for _, domain := range []uint64{compress.DomainRound, compress.DomainRandomK} {
		base, st := compress.StreamBase(7, key, domain), compress.NewRandomStream(7, key, domain)
		for _, i := range []uint64{0, 1, 511, 1 << 31} {
			if got, want := mix64(base+(i+1)*0x9e3779b97f4a7c15), st.Draw(i); got != want {
				t.Errorf("domain %#x draw %d from StreamBase: %#x, want %#x", domain, i, got, want)
			}
			x := uint32(i)*0x9e3779b9 + uint32(base)
			x = (x ^ x>>16) * 0x7feb352d
			x = (x ^ x>>15 ^ uint32(base>>32)) * 0x846ca68b
			if got, want := x^x>>16, st.Draw32(uint32(i)); got != want {
				t.Errorf("domain %#x draw32 %d from StreamBase: %#x, want %#x", domain, i, got, want)
			}
		}
	}
}
