package overlap

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/twolevel"
	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/internal/f32"
)

// The hierarchical exchange (StrategyHier) over K nodes of L ranks each
// takes one of two shapes. Top-k, random-k and powersgd, whose payloads
// are already small (powersgd's are factors of whole matrices, which
// shards would cut), keep their flat strategy (sparse-gather,
// shared-index, low-rank) and exchange over the two-level comm
// (comm/twolevel): each payload crosses between nodes once per node, not
// once per rank, and nothing is re-encoded, so the result is the flat
// strategy's (powersgd's sums in the two-level order: every rank gets
// the same bits, not the flat ring's). Every other codec is
// sharded:
//
//  1. node stage: a float32 reduce-scatter of the bucket among the L ranks
//     of the node (the bucket padded with zeros to L·m elements, m =
//     ⌈n/L⌉); local rank l keeps shard l, the node's sum over elements
//     [l·m, (l+1)·m), and divides it by L: the node's average;
//  2. across nodes: the shard goes to an engine of its own (an Engine over
//     the cross-node comm of the ranks with local rank l, one per node,
//     buckets of m elements) with the configured codec, error feedback,
//     momentum, schedule, guard and decision; its strategy is the one
//     StrategyAuto picks on K ranks. It leaves the average over nodes of
//     the node averages, the average over all ranks, in the shard;
//  3. node stage: an all-gather of the shards among the ranks of the node
//     puts the whole average in the bucket.
//
// This core (the outer one) keeps the step protocol, the handshake over
// every rank (which covers the topology), the node stages and the
// statistics; the engine across nodes keeps everything that compresses,
// and its decisions, memories and state are per shard. The node stages
// run on a stream of their own, in bucket order: bucket i's reduce-scatter
// hands the shard to the engine across nodes, and bucket i's all-gather is
// enqueued after bucket i+1's reduce-scatter (the last one's at once),
// waiting for the shard's decode; so the node link and the link between
// nodes carry different buckets at once, and the order of the node
// collectives depends on the bucket order alone.
//
// Non-finite gradients: a shard with NaN or Inf goes dense across nodes
// (or, with FailOnNonFinite, is skipped) by the engine across nodes, within
// that shard's cross-node group. With FailOnNonFinite the node stage also
// all-reduces, per bucket, whether any rank's shard of the node is
// non-finite, and a rank whose shard is finite marks it (element 0 set to
// NaN) when another one's is not: every cross-node group then skips the
// bucket, so every rank returns the same *NonFiniteStepError and every
// memory stays as it was. Without FailOnNonFinite, BucketStats.NonFinite
// reports what the rank's own cross-node group saw.

// hierBackend runs a sharded StrategyHier core: the node stages on its stream and
// an Engine across nodes for the shards.
type hierBackend struct {
	acrossNodes
	c           *core
	topo        comm.Topology
	node, cross comm.Comm // from the Split; the engine's own, closed by teardown
	nodeData    comm.Comm // node's view without per-call argument checks, where it has one
	inner       *Engine   // the engine across nodes, over cross
	stream      *stream   // the node stages
	shard       [][]float32
	pad         [][]float32 // per bucket: L·m elements when L does not divide n, else nil
	// With Config.NodeSpec (and L > 1): the node stages' compressors and
	// per bucket their slots: the reduce-scatter's L parts sent and
	// received, the all-gather's one sent and L received.
	rs, ag         *parts
	rsSend, rsRecv [][]byte
	agSend, agRecv [][]byte
}

// twoLevelMech returns the mechanism of StrategyHier for codec c on size
// ranks: the flat strategy over the two-level comm for top-k, random-k
// and powersgd, else StrategyHier (sharded).
func twoLevelMech(c compress.Codec, size int) Strategy {
	if c == compress.CodecTopK || c == compress.CodecRandomK || c == compress.CodecPowerSGD {
		s, _ := resolve(StrategyAuto, c, size) // sparse-gather, shared-index, low-rank
		return s
	}
	return StrategyHier
}

// sharded reports whether c runs the sharded StrategyHier (hierBackend).
func (c *core) sharded() bool { return c.strategy == StrategyHier && c.mech == StrategyHier }

// newTwoLevel checks the layout, splits e's comm by node and returns the
// two-level comm a top-k or random-k StrategyHier engine exchanges over.
func newTwoLevel(ctx context.Context, e *Engine) (*twolevel.Comm, error) {
	claimed, err := checkLayout(ctx, e.c, e.layout, e.cfg.Timeout)
	if err != nil {
		return nil, err
	}
	node, cross, err := split(ctx, e.c, claimed, e.cfg.Timeout)
	if err != nil {
		return nil, err
	}
	tl, err := twolevel.New(e.c, node, cross, claimed)
	if err != nil {
		node.Close()
		cross.Close()
		return nil, fmt.Errorf("overlap: rank %d: %w", e.rank, err)
	}
	e.note = fmt.Sprintf("hierarchical (%d nodes × %d ranks): %s over two-level collectives", e.layout.Nodes, e.layout.LocalSize, e.mech)
	return tl, nil
}

// split splits c (a comm.Splitter) by node, bounded by timeout, and
// checks that each group holds the ranks the layout claimed (checkLayout's
// topologies, by rank) in their order: a Splitter (a host mapping group
// ids to its groups, say) that handed this rank another group gets a
// *TopologyError naming both, and the groups are closed.
func split(ctx context.Context, c comm.Comm, claimed []comm.Topology, timeout time.Duration) (node, cross comm.Comm, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if node, cross, err = c.(comm.Splitter).Split(ctx); err != nil {
		return nil, nil, fmt.Errorf("overlap: splitting the comm by node on rank %d: %w", c.Rank(), err)
	}
	me := claimed[c.Rank()]
	for _, g := range []struct {
		name string
		c    comm.Comm
		in   func(t comm.Topology) bool
	}{
		{"node", node, func(t comm.Topology) bool { return t.Node == me.Node }},
		{"cross-node", cross, func(t comm.Topology) bool { return t.LocalRank == me.LocalRank }},
	} {
		if err = checkGroup(ctx, c.Rank(), g.name, g.c, claimed, g.in); err != nil {
			break
		}
	}
	if err != nil {
		node.Close()
		cross.Close()
		return nil, nil, err
	}
	return node, cross, nil
}

// checkGroup all-gathers the parent ranks of group g and checks them
// against the ranks in claims, in rank order (a node's by local rank and
// the cross-node group's by node, as comm.CheckTopologies numbers them).
func checkGroup(ctx context.Context, rank int, name string, g comm.Comm, claimed []comm.Topology, in func(comm.Topology) bool) error {
	var want []int
	for r, t := range claimed {
		if in(t) {
			want = append(want, r)
		}
	}
	all := make([]byte, 4*g.Size())
	mine := binary.LittleEndian.AppendUint32(nil, uint32(rank))
	if g.Size() != len(want) {
		return &TopologyError{Reason: fmt.Sprintf("rank %d's %s group has %d ranks, the layout %d", rank, name, g.Size(), len(want))}
	}
	if err := g.AllGather(ctx, all, mine); err != nil {
		return fmt.Errorf("overlap: checking the %s group on rank %d: %w", name, rank, err)
	}
	got := make([]int, g.Size())
	for i := range got {
		got[i] = int(binary.LittleEndian.Uint32(all[4*i:]))
	}
	if !slices.Equal(got, want) {
		return &TopologyError{Reason: fmt.Sprintf("rank %d's %s group holds ranks %v, the layout says %v", rank, name, got, want)}
	}
	return nil
}

// twoLevelGatherVolume is what one rank sends in a two-level all-gather of
// s bytes per rank on k nodes of l ranks, and the part in the node: s to
// the k−1 other nodes, then the k blocks to the l−1 other ranks of the
// node.
func twoLevelGatherVolume(k, l, s int) [2]int64 {
	in := allGatherVolume(l, k*s)
	return [2]int64{allGatherVolume(k, s) + in, in}
}

// twoLevelReduceVolume is what one rank sends in a two-level all-reduce of
// n float32s on k nodes of l ranks, and the part in the node: a
// reduce-scatter and an all-gather of chunks of m = ⌈n/l⌉ in the node
// (none with l = 1), an all-reduce of the chunk across nodes.
func twoLevelReduceVolume(k, l, n int) [2]int64 {
	if l == 1 {
		return [2]int64{allReduceVolume(k, 4*n), 0}
	}
	m := shardLen(n, l)
	in := allToAllVolume(l, 4*l*m) + allGatherVolume(l, 4*m)
	return [2]int64{allReduceVolume(k, 4*m) + in, in}
}

// hierLayout returns c's topology, or why StrategyHier cannot run on it.
func hierLayout(c comm.Comm) (comm.Topology, error) {
	t, ok := c.(comm.Topologist)
	if !ok {
		return comm.Topology{}, fmt.Errorf("strategy hier needs a comm that knows its nodes (comm.Topologist); %T does not", c)
	}
	if _, ok := c.(comm.Splitter); !ok {
		return comm.Topology{}, fmt.Errorf("strategy hier needs a comm that splits by node (comm.Splitter); %T does not", c)
	}
	topo := t.Topology()
	if topo.Nodes < 1 || topo.LocalSize < 1 || topo.Nodes*topo.LocalSize != c.Size() {
		return topo, fmt.Errorf("topology %d nodes × %d ranks does not cover the %d ranks of the comm", topo.Nodes, topo.LocalSize, c.Size())
	}
	return topo, nil
}

// shardLen is the length m of a shard of a bucket of n elements on nodes
// of l ranks: ⌈n/l⌉.
func shardLen(n, l int) int { return (n + l - 1) / l }

// hierNeed is the host memory the node stages of buckets of sizes need on
// nodes of l ranks: each bucket's shard, its padded copy where l does not
// divide it, and with a node codec (in, else nil) the slots of both
// stages (stageSlots).
func hierNeed(sizes []int, l int, in compress.Compressor) uint64 {
	var need bytesNeed
	for _, n := range sizes {
		m := shardLen(n, l)
		need.addTimes(4, uint64(m))
		if n%l != 0 {
			need.addTimes(4, uint64(l*m))
		}
		if in != nil && l > 1 {
			s1, s2 := nodeParts(in, 0, l)
			need.addTimes(2*uint64(l), uint64(s1.slotLen(l*m)))
			need.addTimes(uint64(l+1), uint64(s2.slotLen(m)))
		}
	}
	return uint64(need)
}

// nodeParts are the node stages' compressors with a node codec in, for
// local rank l of size: the reduce-scatter's size parts of the padded
// bucket, and the all-gather's one (its key the same on every node, so
// that every node sends the same payloads for the same shard).
func nodeParts(in compress.Compressor, l, size int) (rs, ag *parts) {
	return &parts{inner: in, count: size, stage: 1, rank: l, ranks: size},
		&parts{inner: in, count: 1, stage: 2, rank: l, ranks: size}
}

// nodeKey is the key of bucket i's node stages in step num: apart from
// the keys of the engine across nodes, whose bucket numbers stay below 2³¹.
func nodeKey(num uint64, i int) compress.Key {
	return compress.Key{Bucket: uint64(i) | 1<<31, Step: num}
}

// configureHier is configure's end for StrategyHier: the schedule in its
// canonical form (the handshake and the state compare it) and each
// bucket's reason.
func (c *core) configureHier() error {
	ps := make([]Phase, len(c.cfg.Schedule))
	for i, p := range c.cfg.Schedule {
		comp, err := compress.Parse(p.Spec)
		if err != nil {
			return fmt.Errorf("schedule phase %d: %w", i, err)
		}
		ps[i] = Phase{Steps: p.Steps, Spec: comp.Spec().String()}
	}
	c.sched = FormatSchedule(ps)
	for _, b := range c.buckets {
		b.reason = "hierarchical"
	}
	return nil
}

// checkLayout all-gathers every rank's topology after the handshake and
// checks that they describe one layout (comm.CheckTopologies). It returns
// every rank's topology; every rank gets the same error.
func checkLayout(ctx context.Context, c comm.Comm, topo comm.Topology, timeout time.Duration) ([]comm.Topology, error) {
	n := c.Size()
	mine := make([]byte, 16)
	for i, v := range []int{topo.Node, topo.Nodes, topo.LocalRank, topo.LocalSize} {
		binary.LittleEndian.PutUint32(mine[4*i:], uint32(v))
	}
	all := make([]byte, 16*n)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := c.AllGather(ctx, all, mine); err != nil {
		return nil, fmt.Errorf("overlap: topology exchange on rank %d: %w", c.Rank(), err)
	}
	claimed := make([]comm.Topology, n)
	for r := range claimed {
		v := func(i int) int { return int(binary.LittleEndian.Uint32(all[16*r+4*i:])) }
		claimed[r] = comm.Topology{Node: v(0), Nodes: v(1), LocalRank: v(2), LocalSize: v(3)}
	}
	if err := comm.CheckTopologies(claimed); err != nil {
		return nil, &TopologyError{Reason: err.Error()}
	}
	return claimed, nil
}

func describeTopology(t comm.Topology) string {
	return fmt.Sprintf("node %d of %d, local rank %d of %d", t.Node, t.Nodes, t.LocalRank, t.LocalSize)
}

// newHier splits e's comm by node and builds the engine across nodes,
// after the handshake: e's core becomes a StrategyHier core driven by the
// returned backend.
func newHier(ctx context.Context, e *Engine, sizes []int, t timing) (*hierBackend, error) {
	topo := e.layout // hierLayout's, before the handshake
	claimed, err := checkLayout(ctx, e.c, topo, e.cfg.Timeout)
	if err != nil {
		return nil, err
	}
	node, cross, err := split(ctx, e.c, claimed, e.cfg.Timeout)
	if err != nil {
		return nil, err
	}
	h := &hierBackend{c: e.core, topo: topo, node: node, cross: cross, nodeData: node,
		shard: make([][]float32, len(sizes)), pad: make([][]float32, len(sizes))}
	if u, ok := node.(comm.Unchecker); ok {
		h.nodeData = u.Unchecked()
	}
	shards := make([]int, len(sizes))
	l := topo.LocalSize
	if in, _ := nodeCodec(e.cfg.NodeSpec); in != nil && l > 1 { // checkConfig validated it
		h.rs, h.ag = nodeParts(in, topo.LocalRank, l)
		h.rsSend, h.rsRecv = make([][]byte, len(sizes)), make([][]byte, len(sizes))
		h.agSend, h.agRecv = make([][]byte, len(sizes)), make([][]byte, len(sizes))
	}
	for i, n := range sizes {
		shards[i] = shardLen(n, l)
		h.shard[i] = make([]float32, shards[i])
		if n%l != 0 {
			h.pad[i] = make([]float32, l*shards[i])
		}
		if h.rs != nil {
			s1, s2 := h.rs.slotLen(l*shards[i]), h.ag.slotLen(shards[i])
			h.rsSend[i], h.rsRecv[i] = make([]byte, l*s1), make([]byte, l*s1)
			h.agSend[i], h.agRecv[i] = make([]byte, s2), make([]byte, l*s2)
		}
	}
	icfg := e.cfg
	icfg.Strategy = StrategyAuto
	icfg.Shapes = nil // its buckets are shards, not the tensors
	if h.inner, err = newEngine(ctx, cross, shards, icfg, t); err != nil {
		node.Close()
		cross.Close()
		return nil, fmt.Errorf("overlap: the engine across nodes on rank %d (node %d, local rank %d): %w", e.rank, topo.Node, topo.LocalRank, err)
	}
	h.inner.starter = nil // one collective at a time: see inflight.go
	h.acrossNodes = acrossNodes{inner: h.inner.core}
	h.inner.next = e.next
	h.stream = newStream()
	for _, b := range e.buckets {
		b.reason = fmt.Sprintf("hierarchical (%d nodes × %d ranks; across nodes: %s)", topo.Nodes, topo.LocalSize, h.inner.strategy)
	}
	return h, nil
}

// launch enqueues r's reduce-scatter, which hands the shard to the engine
// across nodes, and the previous bucket's all-gather. The first launch of
// a step starts the step across nodes.
func (h *hierBackend) launch(st *step, r *run) error {
	if r.b.idx == 0 {
		if err := h.inner.Step(); err != nil {
			return fmt.Errorf("starting the step across nodes: %w", err)
		}
		st.nested = h.inner.cur
	}
	h.stream.enqueue(func() { h.scatterTask(st, r) })
	if i := r.b.idx; i > 0 {
		prev := st.runs[i-1]
		h.stream.enqueue(func() { h.gatherTask(st, prev) })
	}
	return nil
}

func (h *hierBackend) launched(st *step) error {
	last := st.runs[len(st.runs)-1]
	h.stream.enqueue(func() { h.gatherTask(st, last) })
	st.done = h.stream.record()
	return nil
}

// nodeCollective runs one collective of bucket r on the node comm: every
// byte it sends stays in the node.
func (h *hierBackend) nodeCollective(st *step, r *run, stage string, volume int64, call func(ctx context.Context) error) error {
	return h.c.collective(st, r, stage, [2]int64{volume, volume}, call)
}

// scatterTask runs on the node stream: the node's reduce-scatter of r,
// its average, and the hand-over to the engine across nodes.
func (h *hierBackend) scatterTask(st *step, r *run) {
	if st.failure() != nil {
		return
	}
	i, l := r.b.idx, h.topo.LocalSize
	shard, src := h.shard[i], r.grad
	if p := h.pad[i]; p != nil {
		copy(p, r.grad)
		clear(p[len(r.grad):])
		src = p
	}
	var bad int
	switch {
	case l == 1:
		copy(shard, r.grad)
		bad = compress.Average(shard, l)
	case h.rs != nil:
		var err error
		if bad, err = h.scatterCoded(st, r, src); err != nil {
			st.fail(err)
			return
		}
	default:
		if err := h.nodeCollective(st, r, "node ReduceScatter", allToAllVolume(l, 4*len(src)), func(ctx context.Context) error {
			return h.nodeData.ReduceScatter(ctx, shard, src)
		}); err != nil {
			st.fail(err)
			return
		}
		bad = compress.Average(shard, l)
	}
	if h.c.cfg.FailOnNonFinite && l > 1 {
		flag := []float32{0}
		if bad >= 0 {
			flag[0] = 1
		}
		if err := h.nodeCollective(st, r, "node AllReduce (non-finite flags)", allReduceVolume(l, 4), func(ctx context.Context) error {
			return h.nodeData.AllReduce(ctx, flag)
		}); err != nil {
			st.fail(err)
			return
		}
		if flag[0] != 0 && bad < 0 {
			shard[0] = float32(math.NaN()) // another rank's shard is non-finite: skip the bucket everywhere
		}
	}
	if err := h.inner.Ready(i, shard); err != nil {
		st.fail(&StepError{Step: st.num, Bucket: i, Stage: "hand-over across nodes", Err: err})
	}
}

// gatherTask runs on the node stream: once the engine across nodes has
// decoded r's shard, the node's all-gather of the shards into r.grad.
func (h *hierBackend) gatherTask(st *step, r *run) {
	if st.failure() != nil {
		return
	}
	ir := st.nested.runs[r.b.idx]
	select {
	case <-ir.decoded.fired():
	case <-st.nested.failed:
		st.fail(&StepError{Step: st.num, Bucket: r.b.idx, Stage: "exchange across nodes", Err: st.nested.failure()})
		return
	case <-st.failed:
		return
	}
	i, l := r.b.idx, h.topo.LocalSize
	if l == 1 {
		copy(r.grad, h.shard[i])
		return
	}
	dst := r.grad
	if p := h.pad[i]; p != nil {
		dst = p
	}
	var err error
	if h.ag != nil {
		err = h.gatherCoded(st, r, dst)
	} else {
		err = h.nodeCollective(st, r, "node AllGather", allGatherVolume(l, 4*len(h.shard[i])), func(ctx context.Context) error {
			return h.nodeData.AllGather(ctx, f32.Bytes(dst), f32.Bytes(h.shard[i]))
		})
	}
	if err != nil {
		st.fail(err)
		return
	}
	if h.pad[i] != nil {
		copy(r.grad, dst)
	}
}

// scatterCoded is the node's reduce-scatter of src (L·m elements) with
// Config.NodeSpec's codec: each of the L parts encoded (a NaN or a value
// the codec cannot hold becomes the slot's status), an all-to-all, and
// this rank's part decoded from every rank's slot, summed in rank order
// and divided by L into the shard, NaN where a rank's status is not ok.
// It returns the shard's first non-finite element, or −1.
func (h *hierBackend) scatterCoded(st *step, r *run, src []float32) (int, error) {
	i, l := r.b.idx, h.topo.LocalSize
	send, recv, shard := h.rsSend[i], h.rsRecv[i], h.shard[i]
	if _, _, err := encodeInto(coder{p: h.rs}, send, src, nodeKey(st.num, i), false); err != nil {
		return -1, &StepError{Step: st.num, Bucket: i, Stage: "node encode", Err: err}
	}
	if err := h.nodeCollective(st, r, "node AllToAll", allToAllVolume(l, len(send)), func(ctx context.Context) error {
		return h.nodeData.AllToAll(ctx, recv, send)
	}); err != nil {
		return -1, err
	}
	sts, err := stepStatuses(st, r, "node AllToAll", recv, l, false)
	if err != nil {
		return -1, err
	}
	if !allOK(sts) {
		fillNaN(shard)
		return 0, nil
	}
	bad, err := h.rs.averageSlots(shard, recv, l, fmt.Sprintf("node rank %%d's part %d", h.topo.LocalRank))
	if err != nil {
		return -1, &StepError{Step: st.num, Bucket: i, Stage: "node decode", Err: err}
	}
	return bad, nil
}

// gatherCoded is the node's all-gather of the shards into dst with
// Config.NodeSpec's codec: the shard encoded (under a key every node
// shares), an all-gather, every part decoded, this rank's own included,
// so that every rank of every node ends with the same values; a part
// whose status is not ok is NaN.
func (h *hierBackend) gatherCoded(st *step, r *run, dst []float32) error {
	i, l := r.b.idx, h.topo.LocalSize
	send, recv, shard := h.agSend[i], h.agRecv[i], h.shard[i]
	m := len(shard)
	if _, _, err := encodeInto(coder{p: h.ag}, send, shard, nodeKey(st.num, i), false); err != nil {
		return &StepError{Step: st.num, Bucket: i, Stage: "node encode", Err: err}
	}
	if err := h.nodeCollective(st, r, "node AllGather", allGatherVolume(l, len(send)), func(ctx context.Context) error {
		return h.nodeData.AllGather(ctx, recv, send)
	}); err != nil {
		return err
	}
	sts, err := stepStatuses(st, r, "node AllGather", recv, l, false)
	if err != nil {
		return err
	}
	for j, s := range sts {
		part := dst[j*m : (j+1)*m]
		if s.code != statusOK {
			fillNaN(part)
			continue
		}
		if err := h.ag.decodeSlot(part, recv[j*len(send):(j+1)*len(send)], false); err != nil {
			return &StepError{Step: st.num, Bucket: i, Stage: "node decode", Err: fmt.Errorf("node rank %d's shard: %w", j, err)}
		}
	}
	return nil
}

// fillNaN sets every element of x to NaN.
func fillNaN(x []float32) {
	nan := float32(math.NaN())
	for j := range x {
		x[j] = nan
	}
}

// wait waits for the node stages, then ends the step across nodes (its
// Wait), whose failure, but for a *NonFiniteStepError, fails st.
func (h *hierBackend) wait(ctx context.Context, st *step) error {
	if awaitDone(ctx, st) != nil {
		<-h.stream.record().fired()
	}
	return h.endNested(ctx, st)
}

// teardown closes the engine across nodes, the node stream and the comms
// of the Split.
func (h *hierBackend) teardown() error {
	err := h.inner.Close()
	h.stream.close()
	return errors.Join(err, h.node.Close(), h.cross.Close())
}
