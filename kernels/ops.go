package kernels

import (
	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/gpu"
)

// Encode enqueues on stream s the kernels that write the raw body of
// a.N elements (see EncodeArgs) and returns without waiting for them. A
// NaN or ±Inf in the input (or in e + g), or a value the codec cannot
// represent, is recorded in the status block, not returned: read it with
// StatusError once s has passed the call, and discard the body (and
// ResidOut) if it holds an error. The argument checks run on the host
// before anything is enqueued.
func (c *Codec) Encode(ctx *Context, s gpu.Stream, a EncodeArgs) error {
	plan, err := c.encodePlan(a)
	if err != nil {
		return err
	}
	return ctx.run(s, plan)
}

// Decode enqueues on stream s the kernels that decode a.Bodies into a.Dst
// (see DecodeArgs) and returns without waiting for them. For min-max and
// sign codes up to 8 bodies are decoded and accumulated in one pass over
// Dst (the dequantize-accumulate kernel); the float32 sums follow the
// bodies' order, so the result equals compress's Decompress of the first
// body followed by DecompressAdd of the others (or DecompressAdd of all
// with Add), bit for bit.
func (c *Codec) Decode(ctx *Context, s gpu.Stream, a DecodeArgs) error {
	plan, err := c.decodePlan(a)
	if err != nil {
		return err
	}
	return ctx.run(s, plan)
}

// FillLaplace enqueues on s a kernel that fills n float32 at x with
// Laplace(0, 1) samples drawn from (seed, key): reproducible test and
// benchmark gradients made on the device.
func FillLaplace(ctx *Context, s gpu.Stream, x gpu.Ptr, n int, seed uint64, key compress.Key) error {
	if n < 0 || int64(n) > compress.MaxElements || (n > 0 && (x == 0 || x%4 != 0)) {
		return &ArgumentError{Op: "FillLaplace", Reason: "bad buffer or element count"}
	}
	if n == 0 {
		return nil
	}
	base := compress.StreamBase(seed, key, compress.DomainRound)
	return ctx.run(s, []step{elementwise("gc_fill_laplace", uint64(n), ptrArg(x), uint64(n), base)})
}
