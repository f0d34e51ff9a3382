package overlap

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
	"unsafe"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/compress/lowrank"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/kernels"
)

// fakeDevice is a Device in host memory for the device engine's tests:
// streams are the CPU engine's ordered workers (stream.go), events the
// latest record of an event handle (cuEventRecord semantics: a wait or
// query sees the record made before it; a never-recorded event counts as
// complete), and the kernels are the CPU reference compressors, so a step's
// result is exactly the package doc's. Device addresses are offsets in an
// address space of Go buffers; an access outside an allocation panics the
// stream goroutine (a test failure, by design).
type fakeDevice struct {
	mu      sync.Mutex
	nextPtr gpu.Ptr
	mem     map[gpu.Ptr][]byte
	handles uintptr
	streams map[gpu.Stream]*stream
	events  map[gpu.Event]*fakeEvent
	freed   int
	// failEncode, when set, is returned by Encode (a failed launch).
	failEncode error
}

type fakeEvent struct {
	timing bool
	ev     *event    // the latest record; nil if never recorded
	at     time.Time // when that record fired
}

func newFakeDevice() *fakeDevice {
	return &fakeDevice{nextPtr: 1 << 40, mem: map[gpu.Ptr][]byte{},
		streams: map[gpu.Stream]*stream{}, events: map[gpu.Event]*fakeEvent{}}
}

// close stops the stream goroutines the engine did not destroy (the
// caller's streams of a test).
func (d *fakeDevice) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for h, s := range d.streams {
		s.close()
		delete(d.streams, h)
	}
}

func (d *fakeDevice) Alloc(bytes int) (gpu.Ptr, error) {
	if bytes <= 0 {
		return 0, fmt.Errorf("fake Alloc(%d)", bytes)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.nextPtr
	d.mem[p] = make([]byte, bytes)
	d.nextPtr += gpu.Ptr(bytes+255) &^ 255
	return p, nil
}

func (d *fakeDevice) Free(p gpu.Ptr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.mem[p]; !ok {
		return fmt.Errorf("fake Free(%#x): not allocated", p)
	}
	delete(d.mem, p)
	d.freed++
	return nil
}

// bytes returns the n bytes at p, which must lie inside one allocation.
func (d *fakeDevice) bytes(p gpu.Ptr, n int) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	for base, b := range d.mem {
		if p >= base && uint64(p-base)+uint64(n) <= uint64(len(b)) {
			return b[p-base : int(p-base)+n]
		}
	}
	panic(fmt.Sprintf("fake device: %d bytes at %#x are outside every allocation", n, p))
}

func (d *fakeDevice) floats(p gpu.Ptr, n int) []float32 {
	b := d.bytes(p, 4*n)
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n)
}

func (d *fakeDevice) stream(s gpu.Stream) *stream {
	d.mu.Lock()
	defer d.mu.Unlock()
	st, ok := d.streams[s]
	if !ok {
		panic(fmt.Sprintf("fake device: unknown stream %#x", s))
	}
	return st
}

// enqueue runs fn on stream s in order.
func (d *fakeDevice) enqueue(s gpu.Stream, fn func()) { d.stream(s).enqueue(fn) }

func (d *fakeDevice) sync(s gpu.Stream) { <-d.stream(s).record().fired() }

func (d *fakeDevice) CopyIn(s gpu.Stream, dst gpu.Ptr, src []byte) error {
	data := append([]byte(nil), src...)
	d.enqueue(s, func() { copy(d.bytes(dst, len(data)), data) })
	return nil
}

func (d *fakeDevice) Copy(s gpu.Stream, dst, src gpu.Ptr, bytes int) error {
	d.enqueue(s, func() { copy(d.bytes(dst, bytes), d.bytes(src, bytes)) })
	return nil
}

func (d *fakeDevice) CopyOut(s gpu.Stream, dst []byte, src gpu.Ptr) error {
	d.sync(s)
	copy(dst, d.bytes(src, len(dst)))
	return nil
}

func (d *fakeDevice) NewStream() (gpu.Stream, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.handles++
	h := gpu.Stream(d.handles)
	d.streams[h] = newStream()
	return h, nil
}

func (d *fakeDevice) DestroyStream(s gpu.Stream) error {
	st := d.stream(s)
	st.close()
	d.mu.Lock()
	delete(d.streams, s)
	d.mu.Unlock()
	return nil
}

func (d *fakeDevice) NewEvent(timing bool) (gpu.Event, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.handles++
	h := gpu.Event(d.handles)
	d.events[h] = &fakeEvent{timing: timing}
	return h, nil
}

func (d *fakeDevice) event(e gpu.Event) *fakeEvent {
	d.mu.Lock()
	defer d.mu.Unlock()
	ev, ok := d.events[e]
	if !ok {
		panic(fmt.Sprintf("fake device: unknown event %#x", e))
	}
	return ev
}

func (d *fakeDevice) DestroyEvent(e gpu.Event) error {
	d.event(e)
	d.mu.Lock()
	delete(d.events, e)
	d.mu.Unlock()
	return nil
}

func (d *fakeDevice) Record(e gpu.Event, s gpu.Stream) error {
	fe, st := d.event(e), d.stream(s)
	ev := newEvent()
	st.enqueue(func() {
		d.mu.Lock()
		fe.at = time.Now()
		d.mu.Unlock()
		ev.fire()
	})
	d.mu.Lock()
	fe.ev = ev
	d.mu.Unlock()
	return nil
}

func (d *fakeDevice) WaitEvent(s gpu.Stream, e gpu.Event) error {
	fe, st := d.event(e), d.stream(s)
	d.mu.Lock()
	ev := fe.ev
	d.mu.Unlock()
	if ev != nil {
		st.waitEvent(ev)
	}
	return nil
}

func (d *fakeDevice) EventQuery(e gpu.Event) (bool, error) {
	fe := d.event(e)
	d.mu.Lock()
	ev := fe.ev
	d.mu.Unlock()
	if ev == nil {
		return true, nil
	}
	select {
	case <-ev.fired():
		return true, nil
	default:
		return false, nil
	}
}

func (d *fakeDevice) Elapsed(start, end gpu.Event) (time.Duration, error) {
	a, b := d.event(start), d.event(end)
	d.mu.Lock()
	defer d.mu.Unlock()
	if !a.timing || !b.timing || a.at.IsZero() || b.at.IsZero() {
		return 0, fmt.Errorf("fake Elapsed: events not timing or not completed")
	}
	return b.at.Sub(a.at), nil
}

// setStatus writes the kernels' status word w for a failing element.
func setStatus(status []byte, w int, nf *compress.NonFiniteError) {
	v := uint64(nf.Index)<<32 | uint64(math.Float32bits(nf.Value))
	for i := range 8 {
		status[8*w+i] = byte(v >> (8 * i))
	}
}

// Encode is kernels.Codec.Encode by the CPU reference: the body of
// compress's payload of s = e + g (or g), and s − D(c) into ResidOut.
func (d *fakeDevice) Encode(c *kernels.Codec, s gpu.Stream, a kernels.EncodeArgs) error {
	if d.failEncode != nil {
		return d.failEncode
	}
	ref := c.Reference()
	d.enqueue(s, func() {
		status := d.bytes(a.Status, kernels.StatusLen)
		for i := range status {
			status[i] = 0xff
		}
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
		var nf *compress.NonFiniteError
		if errors.As(err, &nf) {
			setStatus(status, 1, nf)
			return
		} else if err != nil {
			panic(err)
		}
		_, body, err := compress.DecodePayload(ref, payload, a.N)
		if err != nil {
			panic(err)
		}
		copy(d.bytes(a.Body, len(body)), body)
		if a.Resid != 0 {
			dx := make([]float32, a.N)
			if err := ref.Decompress(dx, payload); err != nil {
				panic(err)
			}
			out := d.floats(a.ResidOut, a.N)
			for i := range x {
				out[i] = x[i] - dx[i]
			}
		}
	})
	return nil
}

// Decode is kernels.Codec.Decode by the CPU reference: every body framed
// and decoded (the first set, the others added) in order.
func (d *fakeDevice) Decode(c *kernels.Codec, s gpu.Stream, a kernels.DecodeArgs) error {
	ref := c.Reference()
	d.enqueue(s, func() {
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
				for j := range dst {
					dst[j] = float32(math.NaN())
				}
			}
		}
	})
	return nil
}

// Average is kernels.Average in Go.
func (d *fakeDevice) Average(s gpu.Stream, a kernels.AverageArgs) error {
	d.enqueue(s, func() {
		out := d.bytes(a.Out, kernels.StatusLen)
		for i := range out {
			out[i] = 0xff
		}
		dst := d.floats(a.Dst, a.N)
		for r := range a.Count {
			st := d.bytes(a.Slots+gpu.Ptr(r*a.Stride), kernels.StatusLen)
			if kernels.StatusError(st) != nil {
				for i := range dst {
					dst[i] = float32(math.NaN())
				}
				for i := range 8 {
					out[8+i] = byte(uint64(r) >> (8 * i))
				}
				return
			}
		}
		if bad := compress.Average(dst, a.Ranks); bad >= 0 {
			setStatus(out, 0, &compress.NonFiniteError{Index: bad, Value: dst[bad]})
		}
	})
	return nil
}

// Momentum is kernels.Momentum by the host engine's arithmetic
// (kernels.MomentumStep).
func (d *fakeDevice) Momentum(s gpu.Stream, a kernels.MomentumArgs) error {
	d.enqueue(s, func() {
		status := d.bytes(a.Status, kernels.StatusLen)
		for i := range status {
			status[i] = 0xff
		}
		if bad := kernels.MomentumStep(d.floats(a.Grad, a.N), d.floats(a.U, a.N), d.floats(a.Next, a.N), a.M); bad >= 0 {
			setStatus(status, 0, &compress.NonFiniteError{Index: bad, Value: d.floats(a.Next, a.N)[bad]})
		}
	})
	return nil
}

// Mask is kernels.Codec.Mask by the CPU reference: the body with every
// value set to 1, decoded, marks the indices the payload sent.
func (d *fakeDevice) Mask(c *kernels.Codec, s gpu.Stream, a kernels.MaskArgs) error {
	ref := c.Reference()
	d.enqueue(s, func() {
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
		sent := make([]float32, a.N)
		if err == nil {
			err = ref.Decompress(sent, payload)
		}
		if err != nil {
			panic(err)
		}
		u := d.floats(a.U, a.N)
		for i, v := range sent {
			if v != 0 {
				u[i] = 0
			}
		}
	})
	return nil
}

// Guard is kernels.Guard by its definition, kernels.GuardRatio.
func (d *fakeDevice) Guard(s gpu.Stream, a kernels.GuardArgs) error {
	d.enqueue(s, func() {
		rho := kernels.GuardRatio(d.floats(a.Resid, a.N), d.floats(a.Grad, a.N))
		for q := range a.Count {
			putGuard(d.bytes(a.Dst+gpu.Ptr(q*a.Stride), kernels.GuardLen), rho)
		}
	})
	return nil
}

// GuardMax is kernels.GuardMax in Go.
func (d *fakeDevice) GuardMax(s gpu.Stream, a kernels.GuardMaxArgs) error {
	d.enqueue(s, func() {
		m := 0.0
		for q := range a.Count {
			if v := math.Float64frombits(binary.LittleEndian.Uint64(d.bytes(a.Src+gpu.Ptr(q*a.Stride), 8))); v > m {
				m = v
			}
		}
		putGuard(d.bytes(a.Dst, kernels.GuardLen), m)
	})
	return nil
}

// putGuard writes the guard block of rho to b.
func putGuard(b []byte, rho float64) {
	binary.LittleEndian.PutUint64(b, math.Float64bits(rho))
	binary.LittleEndian.PutUint64(b[8:], 0)
}

// Flush is kernels.Flush in Go (compress.ErrorFeedback.Flush's sum).
func (d *fakeDevice) Flush(s gpu.Stream, a kernels.FlushArgs) error {
	d.enqueue(s, func() {
		g, e, out := d.floats(a.Grad, a.N), d.floats(a.Resid, a.N), d.floats(a.ResidOut, a.N)
		for i := range g {
			g[i] = e[i] + g[i]
			out[i] = 0
		}
	})
	return nil
}

// lowRank returns the host views of a's buffers: M, and the two
// all-reduces' buffers.
func (d *fakeDevice) lowRank(a kernels.LowRankArgs) (m, vals1, vals2 []float32) {
	l := a.Layout
	return d.floats(a.M, l.N), d.floats(a.Vals1, a.Ranks+l.PLen+l.FlatLen), d.floats(a.Vals2, l.QLen)
}

// LowRankEncode is kernels.LowRankEncode by compress/lowrank's CPU round.
func (d *fakeDevice) LowRankEncode(s gpu.Stream, a kernels.LowRankArgs) error {
	d.enqueue(s, func() {
		l := a.Layout
		m, vals1, _ := d.lowRank(a)
		g := d.floats(a.Grad, l.N)
		if a.Resid != 0 {
			for i, e := range d.floats(a.Resid, l.N) {
				m[i] = e + g[i]
			}
		} else {
			copy(m, g)
		}
		q := d.floats(a.Q, l.QLen)
		if a.Warm != 0 {
			copy(q, d.floats(a.Warm, l.QLen))
		}
		l.Encode(vals1, m, q, a.Warm == 0, a.Ranks, a.Rank, a.Seed, a.Key)
	})
	return nil
}

// LowRankReduce is kernels.LowRankReduce by compress/lowrank's CPU round.
func (d *fakeDevice) LowRankReduce(s gpu.Stream, a kernels.LowRankArgs) error {
	d.enqueue(s, func() {
		m, vals1, vals2 := d.lowRank(a)
		if lowrank.Failed(vals1, a.Ranks) >= 0 {
			clear(vals2)
			return
		}
		a.Layout.Reduce(vals1, m, d.floats(a.QOwn, a.Layout.QLen), vals2, a.Ranks)
	})
	return nil
}

// LowRankDecode is kernels.LowRankDecode by compress/lowrank's CPU round.
func (d *fakeDevice) LowRankDecode(s gpu.Stream, a kernels.LowRankArgs) error {
	d.enqueue(s, func() {
		l := a.Layout
		out := d.bytes(a.Out, kernels.StatusLen)
		for i := range out {
			out[i] = 0xff
		}
		m, vals1, vals2 := d.lowRank(a)
		grad := d.floats(a.Grad, l.N)
		if q := lowrank.Failed(vals1, a.Ranks); q >= 0 {
			for i := range grad {
				grad[i] = float32(math.NaN())
			}
			binary.LittleEndian.PutUint64(out[8:], uint64(q))
			return
		}
		var qNext []float32
		if a.QNext != 0 {
			qNext = d.floats(a.QNext, l.QLen)
		}
		if bad := l.Decode(grad, m, m, vals1, vals2, d.floats(a.QOwn, l.QLen), qNext, a.Ranks); bad >= 0 {
			setStatus(out, 0, &compress.NonFiniteError{Index: bad, Value: grad[bad]})
		}
	})
	return nil
}

// fakeDeviceComm is a comm.DeviceComm over a host comm.Comm on the fake
// device's memory: each collective runs on the given stream when the
// stream reaches it (as NCCL's kernels do), and a failure is reported
// asynchronously through Wait, as ncclCommGetAsyncError.
type fakeDeviceComm struct {
	c       comm.Comm
	dev     *fakeDevice
	timeout time.Duration
	base    context.Context // cancelled by an abort: collectives in flight end
	cancel  context.CancelFunc

	mu       sync.Mutex
	asyncErr error
	aborted  bool
	split    []comm.Comm // Split: the cross comm its first call made, until the second takes it
	reduced  []int       // the element counts of the all-reduces enqueued, in order
}

func newFakeDeviceComm(c comm.Comm, dev *fakeDevice, timeout time.Duration) *fakeDeviceComm {
	base, cancel := context.WithCancel(context.Background())
	return &fakeDeviceComm{c: c, dev: dev, timeout: timeout, base: base, cancel: cancel}
}

func (f *fakeDeviceComm) Rank() int { return f.c.Rank() }
func (f *fakeDeviceComm) Size() int { return f.c.Size() }

// run enqueues a collective on s, bounded by the communicator's timeout.
func (f *fakeDeviceComm) run(s gpu.Stream, fn func(ctx context.Context) error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.aborted {
		return errors.New("fake DeviceComm: aborted")
	}
	f.dev.enqueue(s, func() {
		ctx, cancel := context.WithTimeout(f.base, f.timeout)
		defer cancel()
		if err := fn(ctx); err != nil {
			f.mu.Lock()
			if f.asyncErr == nil {
				f.asyncErr = err
			}
			f.mu.Unlock()
		}
	})
	return nil
}

func (f *fakeDeviceComm) AllReduce(ctx context.Context, buf gpu.Ptr, n int, s gpu.Stream) error {
	f.mu.Lock()
	f.reduced = append(f.reduced, n)
	f.mu.Unlock()
	return f.run(s, func(ctx context.Context) error {
		return f.c.AllReduce(ctx, f.dev.floats(buf, n))
	})
}

func (f *fakeDeviceComm) AllGather(ctx context.Context, dst, src gpu.Ptr, n int, s gpu.Stream) error {
	return f.run(s, func(ctx context.Context) error {
		return f.c.AllGather(ctx, f.dev.bytes(dst, n*f.c.Size()), f.dev.bytes(src, n))
	})
}

var errFakeUnused = errors.New("fake DeviceComm: not used by the engine")

func (f *fakeDeviceComm) ReduceScatter(ctx context.Context, dst, src gpu.Ptr, n int, s gpu.Stream) error {
	return f.run(s, func(ctx context.Context) error {
		return f.c.ReduceScatter(ctx, f.dev.floats(dst, n), f.dev.floats(src, n*f.c.Size()))
	})
}

// Split is comm.DeviceSplitter's, for the hierarchical exchange only: the
// host comm (a comm.Splitter) is split by node at the first call, which
// returns the node's DeviceComm (color the node, key the local rank); the
// second returns the cross-node one (color the local rank, key the node).
func (f *fakeDeviceComm) Split(ctx context.Context, color, key int) (comm.DeviceComm, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	topo := f.c.(comm.Topologist).Topology()
	if f.split == nil {
		node, cross, err := f.c.(comm.Splitter).Split(ctx)
		if err != nil {
			return nil, err
		}
		if color != topo.Node || key != topo.LocalRank {
			return nil, fmt.Errorf("fake Split: first call (%d, %d), want the node's (%d, %d)", color, key, topo.Node, topo.LocalRank)
		}
		f.split = []comm.Comm{cross}
		return newFakeDeviceComm(node, f.dev, f.timeout), nil
	}
	if len(f.split) != 1 || color != topo.LocalRank || key != topo.Node {
		return nil, fmt.Errorf("fake Split: call (%d, %d), want the cross-node one (%d, %d) once", color, key, topo.LocalRank, topo.Node)
	}
	cross := f.split[0]
	f.split = f.split[:0:0]
	return newFakeDeviceComm(cross, f.dev, f.timeout), nil
}

func (f *fakeDeviceComm) AllToAll(ctx context.Context, dst, src gpu.Ptr, n int, s gpu.Stream) error {
	if n%f.c.Size() != 0 {
		return fmt.Errorf("fake AllToAll: %d bytes for %d ranks", n, f.c.Size())
	}
	return f.run(s, func(ctx context.Context) error {
		return f.c.AllToAll(ctx, f.dev.bytes(dst, n), f.dev.bytes(src, n))
	})
}

func (f *fakeDeviceComm) Broadcast(context.Context, gpu.Ptr, int, int, gpu.Stream) error {
	return errFakeUnused
}

// Wait polls done and the asynchronous error until the timeout or ctx,
// then aborts (later calls fail), as nccl.Comm.Wait.
func (f *fakeDeviceComm) Wait(ctx context.Context, done func() (bool, error)) error {
	deadline := time.NewTimer(f.timeout)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Microsecond)
	defer tick.Stop()
	for {
		f.mu.Lock()
		err := f.asyncErr
		f.mu.Unlock()
		if err != nil {
			f.abort()
			return fmt.Errorf("fake DeviceComm: asynchronous error: %w", err)
		}
		ok, err := done()
		switch {
		case err != nil:
			return err
		case ok:
			return nil
		}
		select {
		case <-ctx.Done():
			f.abort()
			return fmt.Errorf("fake DeviceComm: aborted: %w", ctx.Err())
		case <-deadline.C:
			f.abort()
			return fmt.Errorf("fake DeviceComm: aborted after the %v timeout", f.timeout)
		case <-tick.C:
		}
	}
}

func (f *fakeDeviceComm) abort() {
	f.mu.Lock()
	f.aborted = true
	f.mu.Unlock()
	f.cancel()
}

func (f *fakeDeviceComm) Close() error { return nil }
