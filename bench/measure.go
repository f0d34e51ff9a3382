package bench

import (
	"context"
	"math"
	"time"

	"github.com/gradcomp/gradcomp/compress"
)

// benchKey is the Key every measured call compresses under.
var benchKey = compress.Key{Bucket: 1, Step: 1}

// references are the compressors a codec's figures are compared with.
type references struct {
	exact compress.Compressor // exact top-k, for a sampled top-k; else nil
	base  compress.Compressor // the spec without its lossless stage; else nil
	stage string              // the lossless stage's name, when base is set
}

// referencesOf builds the references of c.
func referencesOf(c compress.Compressor, workers int) (references, error) {
	var r references
	var err error
	if spec, ok := exactTopK(c); ok {
		if r.exact, err = compress.New(spec, compress.WithWorkers(workers)); err != nil {
			return r, err
		}
	}
	if spec, stage, ok := losslessBase(c); ok {
		if r.base, err = compress.New(spec, compress.WithWorkers(workers)); err != nil {
			return r, err
		}
		r.stage = stage
	}
	return r, nil
}

// buffers are the arrays every codec measured on one gradient shares.
type buffers struct {
	x       []float32 // the gradient
	out     []float32 // copy destination, decode target and accumulator
	ref     []float32 // decoded exact top-k
	payload []byte    // the payload measured
	scratch []byte    // encode destination while timing; reference payloads
}

// newBuffers returns the buffers for gradient x; the others grow on use.
func newBuffers(x []float32) *buffers {
	return &buffers{x: x, out: make([]float32, len(x))}
}

// measure fills a Result for c on b.x. A codec error becomes the Result's
// Error; only ctx's end is returned as an error.
func measure(ctx context.Context, c compress.Compressor, refs references, b *buffers, cfg Config) (Result, error) {
	n := len(b.x)
	r := Result{Codec: c.Spec().String(), Size: n, Dist: cfg.Dist.Name(), Workers: cfg.Workers}
	if err := accuracy(c, refs, b, &r); err != nil {
		return r.failed(err), nil
	}
	payload := b.payload
	watches := []*stopwatch{
		newStopwatch(func() error { parallelCopy(b.out, b.x, cfg.Workers); return nil }),
		newStopwatch(func() error { _, err := c.Compress(b.scratch[:0], b.x, benchKey); return err }),
		newStopwatch(func() error { return c.DecompressAdd(b.out, payload) }),
	}
	if refs.base != nil {
		watches = append(watches, newStopwatch(func() error {
			_, err := refs.base.Compress(b.scratch[:0], b.x, benchKey)
			return err
		}))
	}
	for _, w := range watches {
		if err := w.calibrate(); err != nil {
			return r.failed(err), nil
		}
	}
	start := time.Now()
	for r.Rounds < cfg.MaxRounds && (r.Rounds < cfg.MinRounds || time.Since(start) < cfg.Budget) {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		for _, w := range watches {
			if err := w.sample(); err != nil {
				return r.failed(err), nil
			}
		}
		r.Rounds++
	}
	r.MemcpyGBps = gbps(4*n, watches[0].best)
	r.EncodeGBps = gbps(4*n, watches[1].best)
	r.DecodeGBps = gbps(4*n, watches[2].best)
	r.EncodeVsMemcpy = r.EncodeGBps / r.MemcpyGBps
	if refs.base != nil {
		slowdown := float64(watches[1].best) / float64(watches[3].best)
		r.LosslessEncodeSlowdown = &slowdown
	}
	return r, nil
}

// failed returns r's identity (codec, size, distribution, workers) with
// err as its Error and no figures.
func (r *Result) failed(err error) Result {
	return Result{Codec: r.Codec, Size: r.Size, Dist: r.Dist, Workers: r.Workers, Error: err.Error()}
}

// accuracy encodes b.x once with c into b.payload and sets the size and
// error figures of r: ratio, relative error, recall, lossless gain.
func accuracy(c compress.Compressor, refs references, b *buffers, r *Result) error {
	n := len(b.x)
	payload, err := c.Compress(b.payload[:0], b.x, benchKey)
	if err != nil {
		return err
	}
	b.payload = payload
	r.PayloadBytes = len(payload)
	r.Ratio = float64(4*n) / float64(len(payload))
	if err := c.Decompress(b.out, payload); err != nil {
		return err
	}
	r.RelL2Error = relL2(b.x, b.out)
	if refs.exact != nil {
		if b.scratch, err = refs.exact.Compress(b.scratch[:0], b.x, benchKey); err != nil {
			return err
		}
		if len(b.ref) != n {
			b.ref = make([]float32, n)
		}
		if err := refs.exact.Decompress(b.ref, b.scratch); err != nil {
			return err
		}
		recall, err := Recall(b.out, b.ref)
		if err != nil {
			return err
		}
		r.Recall = &recall
	}
	if refs.base != nil {
		if b.scratch, err = refs.base.Compress(b.scratch[:0], b.x, benchKey); err != nil {
			return err
		}
		gain := float64(len(b.scratch)) / float64(len(payload))
		r.Lossless, r.LosslessRatioGain = refs.stage, &gain
	}
	if cap(b.scratch) < c.MaxEncodedLen(n) {
		b.scratch = make([]byte, 0, c.MaxEncodedLen(n))
	}
	return nil
}

// relL2 returns ‖x − y‖ / ‖x‖ computed in float64; for x = 0 it returns
// ‖y‖, the absolute error.
func relL2(x, y []float32) float64 {
	var num, den float64
	for i, v := range x {
		d := float64(v) - float64(y[i])
		num += d * d
		den += float64(v) * float64(v)
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}
