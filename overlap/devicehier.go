package overlap

import (
	"context"
	"errors"
	"fmt"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/kernels"
)

// The sharded StrategyHier on the device: hier.go's exchange, its node
// stages enqueued on a stream of their own and its engine across nodes a
// DeviceEngine. The DeviceComm splits (comm.DeviceSplitter: ncclCommSplit
// for NCCL) into the node's ranks and the ranks of this local rank, the
// host comm likewise (the engine across nodes' handshake and cost model);
// where the DeviceComm does not split but the host comm's groups carry
// device collectives (comm.DeviceHost: comm/hosted), their device faces
// serve.
// Per bucket i, in bucket order, the node stream
//
//  1. waits for the caller's gradient (Ready's stream), copies it into a
//     zero-padded buffer of L·m elements where L does not divide n, and
//     reduce-scatters it in the node (float32): shard i, m elements;
//  2. divides the shard by L (kernels.Average), recording its first
//     non-finite value, all-gathers the L ranks' records in the node and
//     turns the shard into NaN when any of them has one (kernels.Average
//     on the gathered records): a non-finite gradient anywhere in the node
//     reaches every engine across nodes, so every rank reports it, as the
//     flat device engine does;
//  3. hands the shard to the engine across nodes (its Ready on the node
//     stream), then enqueues bucket i−1's all-gather;
//
// and each all-gather waits for the engine across nodes to have decoded
// its shard (its decode-end event), gathers the shards into the gradient
// (through the padded buffer where there is one). The step's done event
// follows the last all-gather. The results, memories and state are those
// of Engine's sharded StrategyHier over the same comms, bit for bit, but
// for non-finite gradients (the device's rule above).
type devHier struct {
	acrossNodes
	e                *DeviceEngine
	topo             comm.Topology
	node, cross      comm.Comm       // the host comm's split; cross is the inner engine's host comm
	nodeDC, crossDC  comm.DeviceComm // the DeviceComm's split
	inner            *DeviceEngine
	stream           gpu.Stream    // the node stages
	ready            []gpu.Event   // per bucket: the caller's gradient is ready (on its stream)
	shard, pad       []gpu.Ptr     // per bucket: m floats; L·m floats where L does not divide n, else 0
	status, gathered []gpu.Ptr     // per bucket: the shard's record (kernels.StatusLen), the node's (L of them)
	poison           gpu.Ptr       // the poisoning Average's own record
	zeros            gpu.Ptr       // L floats of zero: the padded buffers' tails
	bufs             deviceBuffers // the node stages' buffers
}

// deviceHierCheck says why StrategyHier cannot run over dc and host, or
// nil: the DeviceComm must split, or the host comm carry the device
// collectives of its Split's groups.
func deviceHierCheck(dc comm.DeviceComm, host comm.Comm) error {
	_, splits := dc.(comm.DeviceSplitter)
	_, hosts := host.(comm.DeviceHost)
	if !splits && !hosts {
		return fmt.Errorf("strategy hier needs a DeviceComm that splits (comm.DeviceSplitter) or a host comm that carries its groups' device collectives (comm.DeviceHost); %T and %T do neither", dc, host)
	}
	return nil
}

// newDevHier checks the layout, splits the host comm and the DeviceComm by
// node, builds the engine across nodes and allocates the node stages'
// buffers, after the handshake.
func newDevHier(ctx context.Context, e *DeviceEngine, sizes []int, t timing) (h *devHier, err error) {
	topo := e.layout
	claimed, err := checkLayout(ctx, e.host, topo, e.cfg.Timeout)
	if err != nil {
		return nil, err
	}
	h = &devHier{e: e, topo: topo}
	defer func() {
		if err != nil {
			h.release()
		}
	}()
	if h.node, h.cross, err = split(ctx, e.host, claimed, e.cfg.Timeout); err != nil {
		return nil, err
	}
	if ds, ok := e.dc.(comm.DeviceSplitter); ok {
		sctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
		defer cancel()
		if h.nodeDC, err = ds.Split(sctx, topo.Node, topo.LocalRank); err == nil {
			h.crossDC, err = ds.Split(sctx, topo.LocalRank, topo.Node)
		}
		if err != nil {
			return nil, fmt.Errorf("overlap: splitting the DeviceComm by node on rank %d: %w", e.rank, err)
		}
	} else {
		// The host carries the groups' device collectives (comm.DeviceHost).
		h.nodeDC, h.crossDC = h.node.(comm.DeviceHost).Device(), h.cross.(comm.DeviceHost).Device()
	}
	l := topo.LocalSize
	shards := make([]int, len(sizes))
	for i, n := range sizes {
		shards[i] = shardLen(n, l)
	}
	icfg := e.cfg
	icfg.Strategy = StrategyAuto
	icfg.Shapes = nil // its buckets are shards, not the tensors
	if h.inner, err = newDevice(ctx, e.dev, h.crossDC, h.cross, shards, icfg, t); err != nil {
		return nil, fmt.Errorf("overlap: the engine across nodes on rank %d (node %d, local rank %d): %w", e.rank, topo.Node, topo.LocalRank, err)
	}
	h.acrossNodes = acrossNodes{inner: h.inner.core}
	h.inner.next = e.next
	if err := h.allocate(sizes, shards); err != nil {
		return nil, fmt.Errorf("overlap: NewDevice on rank %d: the node stages: %w", e.rank, err)
	}
	for _, b := range e.buckets {
		b.reason = fmt.Sprintf("hierarchical (%d nodes × %d ranks; across nodes: %s)", topo.Nodes, l, h.inner.strategy)
	}
	return h, nil
}

// allocate makes the node stream, the ready events and the buffers.
func (h *devHier) allocate(sizes, shards []int) error {
	var err error
	if h.stream, err = h.e.dev.NewStream(); err != nil {
		return err
	}
	h.bufs = deviceBuffers{dev: h.e.dev, s: h.stream}
	l := h.topo.LocalSize
	if h.zeros, err = h.bufs.alloc(4*l, true); err != nil {
		return err
	}
	if h.poison, err = h.bufs.alloc(kernels.StatusLen, false); err != nil {
		return err
	}
	n := len(sizes)
	h.ready = make([]gpu.Event, n)
	h.shard, h.pad, h.status, h.gathered = make([]gpu.Ptr, n), make([]gpu.Ptr, n), make([]gpu.Ptr, n), make([]gpu.Ptr, n)
	for i, sz := range sizes {
		if h.ready[i], err = h.e.event(false); err != nil {
			return err
		}
		if h.shard[i], err = h.bufs.alloc(4*shards[i], false); err != nil {
			return err
		}
		if sz%l != 0 {
			if h.pad[i], err = h.bufs.alloc(4*l*shards[i], false); err != nil {
				return err
			}
		}
		if h.status[i], err = h.bufs.alloc(kernels.StatusLen, false); err != nil {
			return err
		}
		if h.gathered[i], err = h.bufs.alloc(l*kernels.StatusLen, false); err != nil {
			return err
		}
	}
	return nil
}

// take is Ready's part for bucket r: the node stream will wait for the
// caller's stream s, where Ready was called.
func (h *devHier) take(r *run, s gpu.Stream) error { return h.e.dev.Record(h.ready[r.b.idx], s) }

// launch enqueues bucket r's reduce-scatter, average and check, hands the
// shard to the engine across nodes, and enqueues the previous bucket's
// all-gather. The first launch of a step starts the step across nodes.
func (h *devHier) launch(st *step, r *run) error {
	i, n, l := r.b.idx, r.b.n, h.topo.LocalSize
	if i == 0 {
		if err := h.inner.Step(); err != nil {
			return fmt.Errorf("starting the step across nodes: %w", err)
		}
		st.nested = h.inner.cur
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.e.cfg.Timeout)
	defer cancel()
	d, s := h.e.dev, h.stream
	m := h.inner.buckets[i].n
	src := r.dgrad
	ops := []func() error{func() error { return d.WaitEvent(s, h.ready[i]) }}
	if p := h.pad[i]; p != 0 {
		src = p
		ops = append(ops,
			func() error { return d.Copy(s, p, r.dgrad, 4*n) },
			func() error { return d.Copy(s, p+gpu.Ptr(4*n), h.zeros, 4*(l*m-n)) })
	}
	if l == 1 {
		ops = append(ops, func() error { return d.Copy(s, h.shard[i], r.dgrad, 4*n) })
	} else {
		ops = append(ops, func() error { return h.nodeDC.ReduceScatter(ctx, h.shard[i], src, m, s) })
	}
	ops = append(ops, func() error {
		return d.Average(s, kernels.AverageArgs{Dst: h.shard[i], N: m, Ranks: l, Out: h.status[i]})
	})
	if l > 1 {
		ops = append(ops,
			func() error { return h.nodeDC.AllGather(ctx, h.gathered[i], h.status[i], kernels.StatusLen, s) },
			func() error {
				return d.Average(s, kernels.AverageArgs{Dst: h.shard[i], N: m, Ranks: 1, Slots: h.gathered[i],
					Stride: kernels.StatusLen, Count: l, Out: h.poison})
			})
	}
	ops = append(ops, func() error { return h.inner.Ready(i, h.shard[i], s) })
	if i > 0 {
		ops = append(ops, func() error { return h.gather(ctx, st.runs[i-1]) })
	}
	return inSequence(ops...)
}

// gather enqueues bucket r's all-gather in the node, after the engine
// across nodes decoded its shard.
func (h *devHier) gather(ctx context.Context, r *run) error {
	i, n, l := r.b.idx, r.b.n, h.topo.LocalSize
	d, s := h.e.dev, h.stream
	m := h.inner.buckets[i].n
	if err := d.WaitEvent(s, h.inner.bufs[i].decEnd); err != nil {
		return err
	}
	if l == 1 {
		return d.Copy(s, r.dgrad, h.shard[i], 4*n)
	}
	dst := r.dgrad
	if p := h.pad[i]; p != 0 {
		dst = p
	}
	if err := h.nodeDC.AllGather(ctx, dst, h.shard[i], 4*m, s); err != nil {
		return err
	}
	if dst != r.dgrad {
		return d.Copy(s, r.dgrad, dst, 4*n)
	}
	return nil
}

// launched enqueues the last bucket's all-gather and the step's done event.
func (h *devHier) launched(st *step) error {
	ctx, cancel := context.WithTimeout(context.Background(), h.e.cfg.Timeout)
	defer cancel()
	if err := h.gather(ctx, st.runs[len(st.runs)-1]); err != nil {
		return err
	}
	return h.e.dev.Record(h.e.done, h.stream)
}

// wait waits for the node stream's done event (recorded now for a step
// that failed or did not launch every bucket), bounded by ctx and the
// DeviceComm's timeout, then ends the step across nodes (its Wait), whose
// failure, but for a *NonFiniteStepError, fails st.
func (h *devHier) wait(ctx context.Context, st *step) error {
	if st.failure() != nil || st.cursor < len(st.runs) {
		if err := h.e.dev.Record(h.e.done, h.stream); err != nil {
			st.fail(&StepError{Step: st.num, Bucket: -1, Stage: "Wait", Err: err})
		}
	}
	if err := h.e.dc.Wait(ctx, func() (bool, error) { return h.e.dev.EventQuery(h.e.done) }); err != nil {
		st.fail(&StepError{Step: st.num, Bucket: -1, Stage: "Wait", Err: err})
	}
	return h.endNested(ctx, st)
}

// conclude adds the node stages' bytes to the statistics across nodes.
func (h *devHier) conclude(st *step) error {
	if err := h.acrossNodes.conclude(st); err != nil {
		return err
	}
	l := h.topo.LocalSize
	if l == 1 {
		return nil
	}
	for i, r := range st.runs {
		m := h.inner.buckets[i].n
		in := allToAllVolume(l, 4*l*m) + allGatherVolume(l, kernels.StatusLen) + allGatherVolume(l, 4*m)
		r.stats.BytesSent += in
		r.stats.BytesInNode += in
	}
	return nil
}

// release frees what newDevHier made; teardown calls it after closing the
// engine across nodes.
func (h *devHier) release() error {
	var errs []error
	if h.inner != nil {
		errs = append(errs, h.inner.Close())
	}
	errs = append(errs, h.bufs.free())
	if h.stream != 0 {
		errs = append(errs, h.e.dev.DestroyStream(h.stream))
	}
	for _, c := range []interface{ Close() error }{h.nodeDC, h.crossDC, h.node, h.cross} {
		if c != nil {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// teardown closes the engine across nodes, frees the node stages'
// buffers and stream, closes the split comms, then releases the outer
// engine's events and streams.
func (h *devHier) teardown() error { return errors.Join(h.release(), h.e.release()) }
