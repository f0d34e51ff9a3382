package overlap

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/internal/f32"
	"github.com/gradcomp/gradcomp/kernels"
)

// The device engine as the cost model's prober (costmodel.go): the link
// probe is an all-reduce on the DeviceComm, the paths are the device's own
// kernels on scratch buffers, timed by its events, and the collectives are
// those of the device's slots. So DecideAuto runs the same model, the same
// margin and the same verification on both backends.

// costModel is DecideAuto's decision on the device: the cost model
// measures, decides every bucket and returns itself.
func (e *DeviceEngine) costModel(ctx context.Context) (*costModel, error) {
	m, err := measure(ctx, e.core, e)
	if err != nil {
		return nil, err
	}
	if err := m.decide(ctx, e.core, e); err != nil {
		return nil, err
	}
	return m, nil
}

// probeAllReduce is the cost model's link probe on the device: an
// all-reduce of floats float32s of device memory on the wire stream,
// waited for.
func (e *DeviceEngine) probeAllReduce(ctx context.Context, floats int) error {
	if e.probeLen < floats {
		if err := e.free(e.probe); err != nil {
			return err
		}
		e.probe, e.probeLen = 0, 0
		p, err := e.alloc(4 * floats)
		if err != nil {
			return err
		}
		if err := e.dev.CopyIn(e.wire, p, make([]byte, 4*floats)); err != nil {
			return err
		}
		e.probe, e.probeLen = p, floats
	}
	if err := e.dc.AllReduce(ctx, e.probe, floats, e.wire); err != nil {
		return err
	}
	return e.sync(ctx, e.wire, e.mark)
}

// sync blocks until stream s passed ev, recorded now, bounded by ctx and
// the DeviceComm's timeout.
func (e *DeviceEngine) sync(ctx context.Context, s gpu.Stream, ev gpu.Event) error {
	if err := e.dev.Record(ev, s); err != nil {
		return err
	}
	return e.dc.Wait(ctx, func() (bool, error) { return e.dev.EventQuery(ev) })
}

// slotLen is the length of a slot carrying n elements in the active
// phase's codec: the head, the body padded to 16 bytes.
func (e *DeviceEngine) slotLen(n int) int { return e.slotHead() + (e.codec.BodyLen(n)+15)&^15 }

// unit returns what one stage-1 encode of a bucket of n elements covers,
// and how many slots it sends: SRA's largest part, one per rank; else the
// bucket, in one slot.
func (e *DeviceEngine) unit(n int) (elems, slots int) {
	if e.mech == StrategyQuantSRA {
		return (n + e.size - 1) / e.size, e.size
	}
	return n, 1
}

// linkCost is the time of a compressed bucket's collectives (its
// devExchanger's volumes) on m's link.
func (e *DeviceEngine) linkCost(m *costModel, b *bucket) float64 {
	var t float64
	for _, v := range e.x.volumes(b) {
		t += m.link(v)
	}
	return t
}

// timePaths times, for a bucket of each size in ns, the device's
// compressed path stage by stage — encode (with the accuracy guard's
// measure), the work between SRA's collectives (decode and average of
// this rank's part, its re-encode), decode and average — and the dense
// path's average, as launch enqueues them, with every rank's payload
// taken to be this rank's (the collectives free, as the host's loopback).
// Each stage's time is the median, from the device's events, over at
// least measureReps runs and measureWindow, after one untimed run.
func (e *DeviceEngine) timePaths(ns []int) ([4][]float64, error) {
	var times [4][]float64
	for _, n := range ns {
		t, err := e.timeBucket(n)
		if err != nil {
			return times, err
		}
		for k := range times {
			times[k] = append(times[k], t[k])
		}
	}
	return times, nil
}

// deviceBuffers are device allocations freed together: timeBucket's
// scratch, the device hier's node-stage buffers.
type deviceBuffers struct {
	dev  Device
	s    gpu.Stream // where the zeroed ones are zeroed
	ptrs []gpu.Ptr
}

// alloc returns a buffer of bytes (at least 16), zeroed when zero is set.
func (b *deviceBuffers) alloc(bytes int, zero bool) (gpu.Ptr, error) {
	bytes = max(bytes, 16)
	p, err := b.dev.Alloc(bytes)
	if err != nil {
		return 0, err
	}
	b.ptrs = append(b.ptrs, p)
	if zero {
		err = b.dev.CopyIn(b.s, p, make([]byte, bytes))
	}
	return p, err
}

// free frees every buffer and returns the failures.
func (b *deviceBuffers) free() error {
	var errs []error
	for _, p := range b.ptrs {
		errs = append(errs, b.dev.Free(p))
	}
	b.ptrs = nil
	return errors.Join(errs...)
}

// timeBucket is timePaths for one size n (a multiple of the world size;
// low-rank: a bucket's size, whose layout it times).
func (e *DeviceEngine) timeBucket(n int) (t [4]float64, err error) {
	sc := &deviceBuffers{dev: e.dev, s: e.enc}
	defer sc.free()
	var stages [4]func() error
	if e.lowRank != nil {
		stages, err = e.lowRankStages(sc, n)
	} else {
		stages, err = e.codecStages(sc, n)
	}
	if err != nil {
		return t, err
	}
	var runs [4][]float64
	for reps, start := 0, time.Now(); reps <= measureReps || time.Since(start) < measureWindow; reps++ {
		if reps == 1 {
			start = time.Now()
		}
		for k, stage := range stages {
			var d float64
			if stage != nil {
				if d, err = e.timeStage(stage); err != nil {
					return t, err
				}
			}
			if reps > 0 {
				runs[k] = append(runs[k], d)
			}
		}
	}
	for k := range runs {
		slices.Sort(runs[k])
		t[k] = runs[k][len(runs[k])/2]
	}
	return t, nil
}

// gradient copies a synthetic gradient of n elements (standard normal,
// the same on every run) to a new buffer of sc.
func (e *DeviceEngine) gradient(sc *deviceBuffers, n int) (gpu.Ptr, error) {
	p, err := sc.alloc(4*n, false)
	if err != nil {
		return 0, err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	g := make([]float32, n)
	for i := range g {
		g[i] = float32(rng.NormFloat64())
	}
	return p, e.dev.CopyIn(e.enc, p, f32.Bytes(g))
}

// lowRankStages returns timeBucket's stages for low-rank on the layout of
// the first bucket of n elements (its compute, fitted against n, stands
// for the others', as on Engine): the encode, the work between the
// all-reduces, the decode (which averages), the dense path's average.
func (e *DeviceEngine) lowRankStages(sc *deviceBuffers, n int) (stages [4]func() error, err error) {
	idx := slices.IndexFunc(e.buckets, func(b *bucket) bool { return b.n == n })
	l := planLowRank(e.cfg.Shapes[idx], *e.lowRank)
	a := kernels.LowRankArgs{Layout: l, Ranks: e.size, Rank: e.rank, Seed: e.lowRank.Seed, Key: compress.Key{Step: 1}}
	if a.Grad, err = e.gradient(sc, n); err != nil {
		return stages, err
	}
	for _, x := range []struct {
		p     *gpu.Ptr
		bytes int
		need  bool
	}{
		{&a.M, 4 * n, true}, {&a.Resid, 4 * n, e.cfg.ErrorFeedback}, {&a.Vals1, 4 * (e.size + l.PLen + l.FlatLen), true},
		{&a.Vals2, 4 * l.QLen, true}, {&a.QOwn, 4 * l.QLen, true}, {&a.Q, 4 * l.QLen, true},
		{&a.Warm, 4 * l.QLen, e.mem2 != nil}, {&a.QNext, 4 * l.QLen, e.mem2 != nil},
		{&a.Work, kernels.LowRankWorkspaceLen(l), true}, {&a.Out, kernels.StatusLen, true},
	} {
		if x.need {
			if *x.p, err = sc.alloc(x.bytes, true); err != nil {
				return stages, err
			}
		}
	}
	dst := a.Grad
	return [4]func() error{
		func() error { return e.dev.LowRankEncode(e.enc, a) },
		func() error { return e.dev.LowRankReduce(e.enc, a) },
		func() error {
			if err := e.dev.LowRankDecode(e.enc, a); err != nil {
				return err
			}
			if c, ok := e.cfg.decaying(); ok && e.cfg.ErrorFeedback {
				return e.dev.Scale(e.enc, kernels.ScaleArgs{X: a.M, N: n, C: c}) // the residual's decay
			}
			return nil
		},
		func() error {
			return e.dev.Average(e.enc, kernels.AverageArgs{Dst: dst, N: n, Ranks: e.size, Out: a.Out})
		},
	}, nil
}

// codecStages returns timeBucket's stages for the active codec's
// strategy on a bucket of n elements.
func (e *DeviceEngine) codecStages(sc *deviceBuffers, n int) (stages [4]func() error, err error) {
	unit, sends := e.unit(n)
	slot, head, part := e.slotLen(unit), e.slotHead(), n/e.size
	ws := e.codec.WorkspaceLen(unit)
	sra, ef := e.mech == StrategyQuantSRA, e.cfg.ErrorFeedback
	grad, err := e.gradient(sc, n)
	if err != nil {
		return stages, err
	}
	var resid, out, dst, send, work, mid, send2, work2, resid2, out2, status gpu.Ptr
	for _, x := range []struct {
		p     *gpu.Ptr
		bytes int
		need  bool
		zero  bool
	}{
		{&resid, 4 * n, ef, true}, {&out, 4 * n, ef, false}, {&dst, 4 * n, true, false},
		{&send, sends * slot, true, false}, {&work, ws, ws > 0, false}, {&status, kernels.StatusLen, true, false},
		{&mid, 4 * part, sra, false}, {&send2, slot, sra, false}, {&work2, ws, sra && ws > 0, false},
		{&resid2, 4 * part, sra && e.mem2 != nil, true}, {&out2, 4 * part, sra && e.mem2 != nil, false},
	} {
		if x.need {
			if *x.p, err = sc.alloc(x.bytes, x.zero); err != nil {
				return stages, err
			}
		}
	}
	bodies := func(body gpu.Ptr) []gpu.Ptr { return slices.Repeat([]gpu.Ptr{body}, e.size) }
	key := compress.Key{Step: 1}
	avg := func(dst gpu.Ptr, elems int) error {
		return e.dev.Average(e.enc, kernels.AverageArgs{Dst: dst, N: elems, Ranks: e.size, Out: status})
	}
	stages = [4]func() error{
		func() error { // encode, as encode enqueues it
			for j := range sends {
				a := kernels.EncodeArgs{Body: send + gpu.Ptr(j*slot+head), Grad: grad + gpu.Ptr(4*j*part), Work: work,
					Status: send + gpu.Ptr(j*slot), N: unit, Key: key}
				if sends > 1 {
					a.N = part
				}
				if ef {
					a.Resid, a.ResidOut = resid+gpu.Ptr(4*j*part), out+gpu.Ptr(4*j*part)
				}
				if err := e.dev.Encode(e.codec, e.enc, a); err != nil {
					return err
				}
			}
			if e.cfg.Guard > 0 {
				if err := e.dev.Guard(e.enc, kernels.GuardArgs{Resid: out, Grad: grad, N: n, Dst: send + kernels.StatusLen, Stride: slot, Count: sends}); err != nil {
					return err
				}
			}
			if c, ok := e.cfg.decaying(); ok && ef {
				return e.dev.Scale(e.enc, kernels.ScaleArgs{X: out, N: n, C: c})
			}
			return nil
		},
		func() error { // SRA's owner: decode and add N part payloads, average, re-encode
			if err := e.dev.Decode(e.codec, e.enc, kernels.DecodeArgs{Dst: mid, N: part, Bodies: bodies(send + gpu.Ptr(head))}); err != nil {
				return err
			}
			if err := avg(mid, part); err != nil {
				return err
			}
			a := kernels.EncodeArgs{Body: send2 + gpu.Ptr(head), Grad: mid, Work: work2, Status: send2, N: part, Key: key}
			if resid2 != 0 {
				a.Resid, a.ResidOut = resid2, out2
			}
			return e.dev.Encode(e.codec, e.enc, a)
		},
		func() error { // decode and average, as launch enqueues them
			switch {
			case sra:
				for j := range e.size {
					a := kernels.DecodeArgs{Dst: dst + gpu.Ptr(4*j*part), N: part, Bodies: []gpu.Ptr{send2 + gpu.Ptr(head)}}
					if err := e.dev.Decode(e.codec, e.enc, a); err != nil {
						return err
					}
				}
			case e.mech == StrategySharedIndex:
				if err := e.dev.Decode(e.codec, e.enc, kernels.DecodeArgs{Dst: dst, N: n, Bodies: []gpu.Ptr{send + gpu.Ptr(head)}, Key: key}); err != nil {
					return err
				}
			case e.comp.Codec() == compress.CodecRandomK:
				for q := range e.size {
					a := kernels.DecodeArgs{Dst: dst, N: n, Add: q > 0, Bodies: []gpu.Ptr{send + gpu.Ptr(head)}, Key: key}
					if err := e.dev.Decode(e.codec, e.enc, a); err != nil {
						return err
					}
				}
			default:
				if err := e.dev.Decode(e.codec, e.enc, kernels.DecodeArgs{Dst: dst, N: n, Bodies: bodies(send + gpu.Ptr(head))}); err != nil {
					return err
				}
			}
			return avg(dst, n)
		},
		func() error { return avg(dst, n) }, // the dense path's average
	}
	if !sra {
		stages[1] = nil // no work between collectives: it takes no time
	}
	return stages, nil
}

// timeStage enqueues stage on the encode stream between the timing events
// and returns its device time in seconds.
func (e *DeviceEngine) timeStage(stage func() error) (float64, error) {
	if err := e.dev.Record(e.timed[0], e.enc); err != nil {
		return 0, err
	}
	if err := stage(); err != nil {
		return 0, err
	}
	if err := e.sync(context.Background(), e.enc, e.timed[1]); err != nil {
		return 0, err
	}
	d, err := e.dev.Elapsed(e.timed[0], e.timed[1])
	return d.Seconds(), err
}
