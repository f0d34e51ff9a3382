package commtest

import (
	"context"
	"fmt"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/internal/f32"
)

// Memory is the device memory a DeviceComm under test works on, as the
// suite needs it: buffers, copies ordered on a stream, and whether a
// stream has finished its work. A real GPU's is the CUDA driver's; a mock
// NCCL's is host memory.
type Memory interface {
	Alloc(bytes int) (gpu.Ptr, error)
	Free(p gpu.Ptr) error
	CopyIn(s gpu.Stream, dst gpu.Ptr, src []byte) error
	CopyOut(s gpu.Stream, dst []byte, src gpu.Ptr) error
	// Synced reports whether s has finished everything enqueued on it.
	Synced(s gpu.Stream) (bool, error)
}

// RunDevice is Run for a comm.DeviceComm: the same collectives, lengths
// and checks, each carried out on device buffers of mem on stream s (copy
// in, the DeviceComm's call, copy out, then dc.Wait until s is done).
// Barrier, which a DeviceComm lacks, is an AllReduce of one element. It
// is collective, like Run.
func RunDevice(ctx context.Context, dc comm.DeviceComm, mem Memory, s gpu.Stream, o Options) error {
	return Run(ctx, &deviceView{dc: dc, mem: mem, s: s}, o)
}

// deviceView is a comm.Comm whose collectives run on a DeviceComm.
type deviceView struct {
	dc  comm.DeviceComm
	mem Memory
	s   gpu.Stream
}

func (v *deviceView) Rank() int    { return v.dc.Rank() }
func (v *deviceView) Size() int    { return v.dc.Size() }
func (v *deviceView) Close() error { return nil }

// run copies ins to fresh device buffers, calls f with their addresses,
// waits for the stream, and copies the buffers back into outs (outs[i]
// nil: not copied back).
func (v *deviceView) run(ctx context.Context, op comm.Op, ins, outs [][]byte, f func(p []gpu.Ptr) error) (err error) {
	p := make([]gpu.Ptr, len(ins))
	for i, b := range ins {
		if p[i], err = v.mem.Alloc(max(len(b), 4)); err != nil {
			return fmt.Errorf("commtest: %v: Alloc: %w", op, err)
		}
		defer v.mem.Free(p[i])
		if err := v.mem.CopyIn(v.s, p[i], b); err != nil {
			return fmt.Errorf("commtest: %v: CopyIn: %w", op, err)
		}
	}
	if err := f(p); err != nil {
		return err
	}
	for i, b := range outs {
		if b != nil {
			if err := v.mem.CopyOut(v.s, b, p[i]); err != nil {
				return fmt.Errorf("commtest: %v: CopyOut: %w", op, err)
			}
		}
	}
	return v.dc.Wait(ctx, func() (bool, error) { return v.mem.Synced(v.s) })
}

func (v *deviceView) AllReduce(ctx context.Context, buf []float32) error {
	b := f32.Bytes(buf)
	return v.run(ctx, comm.OpAllReduce, [][]byte{b}, [][]byte{b}, func(p []gpu.Ptr) error {
		return v.dc.AllReduce(ctx, p[0], len(buf), v.s)
	})
}

func (v *deviceView) AllGather(ctx context.Context, dst, src []byte) error {
	return v.run(ctx, comm.OpAllGather, [][]byte{dst, src}, [][]byte{dst, nil}, func(p []gpu.Ptr) error {
		return v.dc.AllGather(ctx, p[0], p[1], len(src), v.s)
	})
}

func (v *deviceView) ReduceScatter(ctx context.Context, dst, src []float32) error {
	d, s := f32.Bytes(dst), f32.Bytes(src)
	return v.run(ctx, comm.OpReduceScatter, [][]byte{d, s}, [][]byte{d, nil}, func(p []gpu.Ptr) error {
		return v.dc.ReduceScatter(ctx, p[0], p[1], len(dst), v.s)
	})
}

func (v *deviceView) AllToAll(ctx context.Context, dst, src []byte) error {
	return v.run(ctx, comm.OpAllToAll, [][]byte{dst, src}, [][]byte{dst, nil}, func(p []gpu.Ptr) error {
		return v.dc.AllToAll(ctx, p[0], p[1], len(src), v.s)
	})
}

func (v *deviceView) Broadcast(ctx context.Context, buf []byte, root int) error {
	return v.run(ctx, comm.OpBroadcast, [][]byte{buf}, [][]byte{buf}, func(p []gpu.Ptr) error {
		return v.dc.Broadcast(ctx, p[0], len(buf), root, v.s)
	})
}

func (v *deviceView) Barrier(ctx context.Context) error {
	return v.AllReduce(ctx, make([]float32, 1))
}
