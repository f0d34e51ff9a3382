package overlap

import (
	"context"
	"fmt"

	"github.com/gradcomp/gradcomp/comm"
)

// loopback is the comm.Comm over which the cost model times the engine's
// own compressed path: a group of Size() ranks that all send what this one
// sends. Collectives complete at once (their time comes from the link
// probe), with the results such a group would get, so the decode code runs
// on valid payloads.
type loopback struct{ rank, size int }

func (l *loopback) Rank() int { return l.rank }
func (l *loopback) Size() int { return l.size }

// AllReduce leaves the sum of Size() copies of buf.
func (l *loopback) AllReduce(_ context.Context, buf []float32) error {
	n := float32(l.size)
	for i := range buf {
		buf[i] *= n
	}
	return nil
}

// AllGather fills dst with Size() copies of src.
func (l *loopback) AllGather(_ context.Context, dst, src []byte) error {
	if len(dst) != l.size*len(src) {
		return fmt.Errorf("overlap: loopback AllGather: len(dst) = %d, want %d", len(dst), l.size*len(src))
	}
	for q := range l.size {
		copy(dst[q*len(src):], src)
	}
	return nil
}

// ReduceScatter leaves Size() times this rank's chunk of src.
func (l *loopback) ReduceScatter(_ context.Context, dst, src []float32) error {
	if len(src) != l.size*len(dst) {
		return fmt.Errorf("overlap: loopback ReduceScatter: len(src) = %d, want %d", len(src), l.size*len(dst))
	}
	n := float32(l.size)
	for i, v := range src[l.rank*len(dst) : (l.rank+1)*len(dst)] {
		dst[i] = n * v
	}
	return nil
}

// AllToAll fills every chunk of dst with chunk Rank() of src: what every
// rank, sending what this one does, sends to it.
func (l *loopback) AllToAll(_ context.Context, dst, src []byte) error {
	if len(dst) != len(src) || len(src)%l.size != 0 {
		return fmt.Errorf("overlap: loopback AllToAll: lengths %d and %d for %d ranks", len(dst), len(src), l.size)
	}
	m := len(src) / l.size
	for q := range l.size {
		copy(dst[q*m:(q+1)*m], src[l.rank*m:(l.rank+1)*m])
	}
	return nil
}

func (l *loopback) Broadcast(context.Context, []byte, int) error { return nil }
func (l *loopback) Barrier(context.Context) error                { return nil }
func (l *loopback) Close() error                                 { return nil }

var _ comm.Comm = (*loopback)(nil)
