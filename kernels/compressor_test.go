package kernels

import (
	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/internal/f32"
)

// testCompressor is a compress.Compressor whose encoding and decoding run on
// the device: each call copies its host input to device memory, runs the
// kernels on the compressor's own stream, waits for them and copies the
// result back. Its payloads are byte-identical to compress.Parse(spec)'s,
// which frames and validates them (compress.EncodePayload and
// DecodePayload). It is the tests' adapter: it runs compresstest's
// conformance suite on the device; gradcomp itself calls Codec.Encode and
// Decode on device buffers. It is safe for concurrent use.
type testCompressor struct {
	codec *Codec
	ctx   *Context
	s     gpu.Stream
}

// newTestCompressor returns the device compressor of spec on ctx, with a new
// stream. Close releases the stream.
func newTestCompressor(ctx *Context, spec string) (*testCompressor, error) {
	codec, err := codecOf(spec)
	if err != nil {
		return nil, err
	}
	s, err := ctx.NewStream()
	if err != nil {
		return nil, err
	}
	return &testCompressor{codec: codec, ctx: ctx, s: s}, nil
}

// Close destroys the compressor's stream; later calls fail.
func (c *testCompressor) Close() error { return c.ctx.DestroyStream(c.s) }

// Spec returns the compressor's configuration.
func (c *testCompressor) Spec() compress.Spec { return c.codec.Spec() }

// Codec returns the codec this compressor writes.
func (c *testCompressor) Codec() compress.Codec { return c.codec.codec }

// MaxEncodedLen returns the largest payload for n elements, as the CPU
// reference's.
func (c *testCompressor) MaxEncodedLen(n int) int { return c.codec.ref.MaxEncodedLen(n) }

// Compress appends the payload of src under key to dst, as
// compress.Compressor documents (a NaN or ±Inf is a *compress.NonFiniteError
// and dst comes back unchanged).
func (c *testCompressor) Compress(dst []byte, src []float32, key compress.Key) ([]byte, error) {
	return compress.EncodePayload(c.codec.ref, dst, len(src), key, func(body []byte) error {
		return c.encode(body, src, key)
	})
}

// Decompress validates payload on the host and sets dst to its values,
// decoded on the device; on error dst is untouched.
func (c *testCompressor) Decompress(dst []float32, payload []byte) error {
	return c.decompress(dst, payload, false)
}

// DecompressAdd is Decompress adding the values to dst.
func (c *testCompressor) DecompressAdd(dst []float32, payload []byte) error {
	return c.decompress(dst, payload, true)
}

// buffers is the device memory of one call, freed together.
type buffers struct {
	ctx  *Context
	ptrs []gpu.Ptr
}

func (b *buffers) alloc(bytes int) (gpu.Ptr, error) {
	p, err := b.ctx.Alloc(max(bytes, 4))
	if err == nil {
		b.ptrs = append(b.ptrs, p)
	}
	return p, err
}

// free releases every buffer and adds the first failure to *err.
func (b *buffers) free(err *error) {
	for _, p := range b.ptrs {
		if e := b.ctx.Free(p); e != nil && *err == nil {
			*err = e
		}
	}
}

func (c *testCompressor) encode(body []byte, src []float32, key compress.Key) (err error) {
	n := len(src)
	if n == 0 {
		return nil
	}
	bufs := &buffers{ctx: c.ctx}
	defer bufs.free(&err)
	a := EncodeArgs{N: n, Key: key}
	for _, b := range []struct {
		p     *gpu.Ptr
		bytes int
	}{{&a.Grad, 4 * n}, {&a.Body, len(body)}, {&a.Status, StatusLen}, {&a.Work, c.codec.WorkspaceLen(n)}} {
		if b.bytes == 0 {
			continue
		}
		if *b.p, err = bufs.alloc(b.bytes); err != nil {
			return err
		}
	}
	if err := c.ctx.CopyIn(c.s, a.Grad, f32.Bytes(src)); err != nil {
		return err
	}
	if err := c.codec.Encode(c.ctx, c.s, a); err != nil {
		return err
	}
	status := make([]byte, StatusLen)
	if err := c.ctx.CopyOut(c.s, status, a.Status); err != nil {
		return err
	}
	if err := StatusError(status); err != nil {
		return err
	}
	return c.ctx.CopyOut(c.s, body, a.Body)
}

func (c *testCompressor) decompress(dst []float32, payload []byte, add bool) (err error) {
	h, body, err := compress.DecodePayload(c.codec.ref, payload, len(dst))
	if err != nil || len(dst) == 0 {
		return err
	}
	bufs := &buffers{ctx: c.ctx}
	defer bufs.free(&err)
	d, err := bufs.alloc(4 * len(dst))
	if err != nil {
		return err
	}
	b, err := bufs.alloc(len(body))
	if err != nil {
		return err
	}
	if err := c.ctx.CopyIn(c.s, b, body); err != nil {
		return err
	}
	if add {
		if err := c.ctx.CopyIn(c.s, d, f32.Bytes(dst)); err != nil {
			return err
		}
	}
	if err := c.codec.Decode(c.ctx, c.s, DecodeArgs{Dst: d, N: len(dst), Add: add, Bodies: []gpu.Ptr{b}, Key: h.Key}); err != nil {
		return err
	}
	out := make([]float32, len(dst)) // dst stays untouched unless everything succeeds
	if err := c.ctx.CopyOut(c.s, f32.Bytes(out), d); err != nil {
		return err
	}
	copy(dst, out)
	return nil
}
