package fakegpu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/kernels"
)

// Encode is kernels.Codec.Encode by the CPU reference: the body of
// compress's payload of s = e + g (or g), and s − D(c) into ResidOut.
func (d *Device) Encode(c *kernels.Codec, s gpu.Stream, a kernels.EncodeArgs) error {
	ref := c.Reference()
	return d.kernel("Encode", s, func() {
		status := d.bytes(a.Status, kernels.StatusLen)
		resetStatus(status)
		x := append([]float32(nil), d.floats(a.Grad, a.N)...)
		if a.Resid != 0 {
			for i, e := range d.floats(a.Resid, a.N) {
				x[i] = e + x[i]
			}
		}
		for i, v := range x {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				setStatus(status, 0, &compress.NonFiniteError{Index: i, Value: v})
				return
			}
		}
		payload, err := ref.Compress(nil, x, a.Key)
		if nf := (*compress.NonFiniteError)(nil); errors.As(err, &nf) {
			setStatus(status, 1, nf)
			return
		}
		must("Encode: compress", err)
		_, body, err := compress.DecodePayload(ref, payload, a.N)
		must("Encode: frame", err)
		copy(d.bytes(a.Body, len(body)), body)
		if a.Resid != 0 {
			dx := make([]float32, a.N)
			must("Encode: decompress", ref.Decompress(dx, payload))
			out := d.floats(a.ResidOut, a.N)
			for i := range x {
				out[i] = x[i] - dx[i]
			}
		}
	})
}

// must faults the running kernel with err, if any.
func must(what string, err error) {
	if err != nil {
		throw(fmt.Errorf("%s: %w", what, err))
	}
}

// Decode is kernels.Codec.Decode by the CPU reference: every body framed
// and decoded (the first set, the others added) in order.
func (d *Device) Decode(c *kernels.Codec, s gpu.Stream, a kernels.DecodeArgs) error {
	ref := c.Reference()
	return d.kernel("Decode", s, func() {
		dst := d.floats(a.Dst, a.N)
		for i, b := range a.Bodies {
			payload, err := compress.EncodePayload(ref, nil, a.N, a.Key, func(body []byte) error {
				copy(body, d.bytes(b, len(body)))
				return nil
			})
			if err == nil {
				if i == 0 && !a.Add {
					err = ref.Decompress(dst, payload)
				} else {
					err = ref.DecompressAdd(dst, payload)
				}
			}
			if err != nil {
				// A status-failed slot holds no body: the kernels decode
				// garbage, which Average then poisons. Do the same.
				poison(dst)
			}
		}
	})
}

// Mask is kernels.Codec.Mask by the CPU reference: the body with every
// value set to 1, decoded, marks the indices the payload sent.
func (d *Device) Mask(c *kernels.Codec, s gpu.Stream, a kernels.MaskArgs) error {
	ref := c.Reference()
	return d.kernel("Mask", s, func() {
		if a.Gate != 0 && kernels.StatusError(d.bytes(a.Gate, kernels.StatusLen)) != nil {
			return
		}
		payload, err := compress.EncodePayload(ref, nil, a.N, a.Key, func(body []byte) error {
			vals := body // random-k: the values alone
			if ref.Codec() == compress.CodecTopK {
				copy(body, d.bytes(a.Body, len(body)))
				vals = body[len(body)/2:] // top-k: k indices, then k values
			}
			for j := 0; j < len(vals); j += 4 {
				binary.LittleEndian.PutUint32(vals[j:], math.Float32bits(1))
			}
			return nil
		})
		must("Mask: frame", err)
		sent := make([]float32, a.N)
		must("Mask: decompress", ref.Decompress(sent, payload))
		u := d.floats(a.U, a.N)
		for i, v := range sent {
			if v != 0 {
				u[i] = 0
			}
		}
	})
}
