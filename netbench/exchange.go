package netbench

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/compress"
)

// exchange averages a gradient over the ranks of a group.
type exchange interface {
	// run replaces grad, on every rank, with the rank average of the
	// ranks' grads (as the exchange defines it: exact for the dense
	// all-reduce, of the decompressed payloads otherwise).
	run(ctx context.Context, grad []float32) (sample, error)
	close() error
}

// sample is what one run of an exchange reports about itself.
type sample struct {
	strategy   string // as Result.Strategy
	bytesSent  int64  // bytes this rank put on the wire
	buckets    int
	compressed int // buckets that crossed compressed
	reason     string
}

// newExchange builds the exchange of case cs on c.
func newExchange(_ context.Context, c comm.Comm, cs Case, cfg Config) (exchange, error) {
	if cs.Decision == Baseline {
		return &denseAllReduce{c: c, timeout: cfg.Timeout}, nil
	}
	return newAllGather(c, cs, cfg)
}

// denseAllReduce is the baseline: one all-reduce of the whole gradient, then
// the division by the rank count.
type denseAllReduce struct {
	c       comm.Comm
	timeout time.Duration
}

func (d *denseAllReduce) run(ctx context.Context, grad []float32) (sample, error) {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	if err := d.c.AllReduce(ctx, grad); err != nil {
		return sample{}, err
	}
	n := d.c.Size()
	scale(grad, n)
	// A ring all-reduce sends 2(n−1)/n of the buffer from every rank.
	sent := 2 * int64(n-1) * 4 * int64(len(grad)) / int64(n)
	return sample{strategy: "dense", bytesSent: sent, buckets: 1}, nil
}

func (d *denseAllReduce) close() error { return nil }

// scale divides every element of x by n.
func scale(x []float32, n int) {
	s := 1 / float32(n)
	for i := range x {
		x[i] *= s
	}
}

// allGather exchanges whole compressed payloads: every rank compresses its
// gradient, the payloads are all-gathered and each rank decompresses and
// adds all of them. For top-k this is the sparse-gather strategy.
type allGather struct {
	c        comm.Comm
	codec    compress.Compressor
	timeout  time.Duration
	step     uint64
	payload  []byte
	gathered []byte
}

func newAllGather(c comm.Comm, cs Case, cfg Config) (*allGather, error) {
	codec, err := compress.Parse(cs.Codec, compress.WithWorkers(cfg.Workers))
	if err != nil {
		return nil, err
	}
	n := codec.MaxEncodedLen(cfg.Size)
	return &allGather{c: c, codec: codec, timeout: cfg.Timeout, payload: make([]byte, 0, n), gathered: make([]byte, c.Size()*n)}, nil
}

func (a *allGather) run(ctx context.Context, grad []float32) (sample, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	a.step++
	p, err := a.codec.Compress(a.payload[:0], grad, compress.Key{Step: a.step})
	if err != nil {
		return sample{}, err
	}
	if len(p) != cap(a.payload) {
		return sample{}, fmt.Errorf("netbench: %s payload of %d bytes, want the fixed %d an all-gather needs", a.codec.Spec(), len(p), cap(a.payload))
	}
	if err := a.c.AllGather(ctx, a.gathered, p); err != nil {
		return sample{}, err
	}
	clear(grad)
	for r := range a.c.Size() {
		if err := a.codec.DecompressAdd(grad, a.gathered[r*len(p):(r+1)*len(p)]); err != nil {
			return sample{}, fmt.Errorf("netbench: payload of rank %d: %w", r, err)
		}
	}
	scale(grad, a.c.Size())
	strategy := "allgather"
	if a.codec.Codec() == compress.CodecTopK {
		strategy = "sparse-gather"
	}
	return sample{strategy: strategy, bytesSent: int64(a.c.Size()-1) * int64(len(p)), buckets: 1, compressed: 1}, nil
}

func (a *allGather) close() error { return nil }

// gatherFloats all-gathers xs (the same length on every rank) and returns
// every rank's values in rank order.
func gatherFloats(ctx context.Context, c comm.Comm, timeout time.Duration, xs []float64) ([]float64, error) {
	src := make([]byte, 8*len(xs))
	for i, x := range xs {
		binary.LittleEndian.PutUint64(src[8*i:], math.Float64bits(x))
	}
	dst := make([]byte, c.Size()*len(src))
	if err := withTimeout(ctx, timeout, func(ctx context.Context) error { return c.AllGather(ctx, dst, src) }); err != nil {
		return nil, err
	}
	all := make([]float64, len(dst)/8)
	for i := range all {
		all[i] = math.Float64frombits(binary.LittleEndian.Uint64(dst[8*i:]))
	}
	return all, nil
}

// barrier waits for every rank of c, for at most timeout.
func barrier(ctx context.Context, c comm.Comm, timeout time.Duration) error {
	return withTimeout(ctx, timeout, c.Barrier)
}

// withTimeout calls f with ctx bounded by timeout.
func withTimeout(ctx context.Context, timeout time.Duration, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return f(ctx)
}
