package outer

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"math"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/internal/record"
	"github.com/gradcomp/gradcomp/overlap"
)

// The state format, version 1, little-endian:
//
//	"GCOL", version (1 byte)
//	world size (uint32), rank (uint32)
//	the shared part's length (uint64), then the shared part, the same on
//	  every rank:
//	    the configuration record's length (uint32), the record (fields
//	      as (uint32 length, bytes) pairs of name and value, named as the
//	      handshake names them: SyncEvery, Fragments, Delay, Alpha,
//	      Optimizer, BucketElements, tensors, then per tensor its
//	      elements, fragment and shape)
//	    the inner step s (uint64)
//	    the global weights: every tensor's float32s, in order
//	    the momentum: present (1 byte), then every tensor's float32s
//	    per fragment, its sync started and not yet applied at s: 0 none;
//	      1 arrived, then the step it started at (uint64) and the average,
//	      every bucket's float32s in order; 2 skipped, its average not
//	      finite, then the step it started at (uint64), the engine's step
//	      (uint64), the bucket count (uint32), per bucket its index
//	      (uint32), the length of who had what (uint32) and that text
//	per fragment: its engine's state length (uint64), the state
//	  (overlap.Engine.Save's format)
//	CRC32C of every byte before it (uint32)
const (
	stateMagic   = "GCOL"
	stateVersion = 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Save writes this rank's state to w: the configuration, the inner step
// count, the global weights, the outer momentum, the syncs in flight and
// every fragment engine's state (state.go specifies the format). Call it
// on every rank at the same inner step, between Steps. A sync in flight
// is first waited for (its exchange ends as it would at its finish; the
// wait is bounded by Engine.Timeout) and its arrived average is saved, to
// be applied at its finish step, so a run resumed from the state applies
// exactly what the uninterrupted run applies. params are not saved: they
// are the caller's to checkpoint, with its inner optimizer. A failed wait
// breaks the Loop as in Step; a closed or broken Loop does not save. The
// state is built in memory, then written.
func (l *Loop) Save(w io.Writer) error {
	if err := l.usable("Save"); err != nil {
		return err
	}
	for _, f := range l.frags {
		if f.flight != nil && !f.flight.waited {
			if err := l.wait(context.Background(), f); err != nil {
				return err
			}
		}
	}
	b := append([]byte(stateMagic), stateVersion)
	b = binary.LittleEndian.AppendUint32(b, uint32(l.c.Size()))
	b = binary.LittleEndian.AppendUint32(b, uint32(l.c.Rank()))
	shared := l.encodeShared()
	b = binary.LittleEndian.AppendUint64(b, uint64(len(shared)))
	b = append(b, shared...)
	for _, f := range l.frags {
		var e bytes.Buffer
		if err := f.eng.Save(&e); err != nil {
			return fmt.Errorf("outer: Save on rank %d: fragment %d's engine: %w", l.c.Rank(), f.idx, err)
		}
		b = binary.LittleEndian.AppendUint64(b, uint64(e.Len()))
		b = append(b, e.Bytes()...)
	}
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("outer: Save on rank %d: %w", l.c.Rank(), err)
	}
	return nil
}

// encodeShared is the shared part of the state.
func (l *Loop) encodeShared() []byte {
	rec := record.Encode(l.s.record())
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(rec)))
	b = append(b, rec...)
	b = binary.LittleEndian.AppendUint64(b, l.step)
	b = appendFloats(b, l.global)
	b = append(b, boolByte(l.momentum != nil))
	b = appendFloats(b, l.momentum)
	for _, f := range l.frags {
		x := f.flight
		switch {
		case x == nil:
			b = append(b, 0)
		case x.nonFinite == nil:
			b = append(b, 1)
			b = binary.LittleEndian.AppendUint64(b, x.started)
			b = appendFloats(b, f.bufs)
		default:
			b = append(b, 2)
			b = binary.LittleEndian.AppendUint64(b, x.started)
			b = binary.LittleEndian.AppendUint64(b, x.nonFinite.Step)
			b = binary.LittleEndian.AppendUint32(b, uint32(len(x.nonFinite.Buckets)))
			for i, k := range x.nonFinite.Buckets {
				b = binary.LittleEndian.AppendUint32(b, uint32(k))
				b = binary.LittleEndian.AppendUint32(b, uint32(len(x.nonFinite.Details[i])))
				b = append(b, x.nonFinite.Details[i]...)
			}
		}
	}
	return b
}

func appendFloats(b []byte, xs [][]float32) []byte {
	for _, x := range xs {
		for _, v := range x {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
		}
	}
	return b
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// Load replaces this Loop's state with one Save wrote, on every rank at
// once (collective over the Loop's Comm, bounded by ctx and
// Engine.Timeout): the inner step count, the global weights, the outer
// momentum, the syncs in flight and the fragment engines' states. Every
// rank passes the state that rank saved, or nil where the saved job had no
// such rank (a job grown since). Each rank first validates its state whole
// (format, checksum, configuration, engine states): a state of another
// model (tensors, their fragments), another schedule or optimizer
// (SyncEvery, Fragments, Delay, Alpha, Optimizer, BucketElements) or
// engine (spec, strategy, …) is a *StateError naming the field and both
// values; ranks whose states disagree (another step, other global weights)
// are refused too; every rank then fails alike and nothing changes.
//
// On the saved number of ranks every engine takes its rank's state as it
// was (overlap.Engine.Load), and the resumed run is bit for bit the
// uninterrupted one. On another number (or where a rank passes nil) the
// shared part comes from the lowest rank that has a state and the engines
// reshape theirs (overlap.Engine.LoadReshaped: the residuals are summed and
// handed out again; a job that shrank drops what the saved ranks it no
// longer has held back, since each rank passes one state). OnNonFinite and
// the engines' local settings (Timeout, Workers) may differ from the
// saved run's.
//
// params are the caller's: Load neither reads nor writes them; restore
// them (and the inner optimizer) from the caller's own checkpoint of the
// same step. Load with a sync in flight is refused: load into a new Loop.
// A failure once the engines' states are being replaced (a collective of
// the reshaping) breaks the Loop.
func (l *Loop) Load(ctx context.Context, r io.Reader) error {
	if err := l.usable("Load"); err != nil {
		return err
	}
	var st *state
	var mine error
	for _, f := range l.frags {
		if f.flight != nil && mine == nil {
			mine = &StateError{Reason: fmt.Sprintf("fragment %d's sync started at step %d is in flight: load into a new Loop", f.idx, f.flight.started)}
		}
	}
	if r != nil && mine == nil {
		st, mine = l.readState(r)
	}
	d := digest{status: digestNone}
	switch {
	case mine != nil:
		d.status = digestRefused
	case st != nil:
		d = digest{status: digestOK, world: uint32(st.world), rank: uint32(st.rank), step: st.step,
			crc: crc32.Checksum(st.sharedBytes, castagnoli), length: uint64(len(st.sharedBytes))}
	}
	ds, err := l.gatherDigests(ctx, d)
	if err != nil {
		return err
	}
	src, reshape, err := agreeStates(ds, l.c.Size(), mine)
	if err != nil {
		return err
	}
	if reshape {
		if st, err = l.shareState(ctx, st, ds[src], src); err != nil {
			return l.fail(err)
		}
	}
	for _, f := range l.frags {
		if err := l.loadEngine(ctx, f, st, reshape); err != nil {
			return l.fail(fmt.Errorf("outer: Load on rank %d: fragment %d's engine state: %w", l.c.Rank(), f.idx, err))
		}
	}
	l.install(st)
	return nil
}

// loadEngine loads fragment f's engine state from st: as saved, or
// reshaped (collective; st.engines is nil on a rank without a state).
func (l *Loop) loadEngine(ctx context.Context, f *fragment, st *state, reshape bool) error {
	if !reshape {
		return f.eng.Load(bytes.NewReader(st.engines[f.idx]))
	}
	var r io.Reader // nil: this rank adds nothing
	if st.engines != nil {
		r = bytes.NewReader(st.engines[f.idx])
	}
	return f.eng.LoadReshaped(ctx, r)
}

// install replaces the Loop's shared state with st's.
func (l *Loop) install(st *state) {
	l.step = st.step
	for t := range l.global {
		copy(l.global[t], st.global[t])
		if l.momentum != nil {
			copy(l.momentum[t], st.momentum[t])
		}
	}
	for _, f := range l.frags {
		f.flight = st.syncs[f.idx]
		if avg := st.averages[f.idx]; avg != nil {
			for b := range f.bufs {
				copy(f.bufs[b], avg[b])
			}
		}
	}
}

// state is a state read and validated, ready to install.
type state struct {
	world, rank int
	sharedBytes []byte
	engines     [][]byte // per fragment; nil on a rank given only the shared part
	step        uint64
	global      [][]float32
	momentum    [][]float32   // nil without
	syncs       []*exchange   // per fragment: the sync in flight (waited), or nil
	averages    [][][]float32 // per fragment with an arrived sync: its buckets
}

// readState reads a state and validates it whole against l; it changes
// nothing.
func (l *Loop) readState(r io.Reader) (*state, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, &StateError{Reason: "reading the state", Err: err}
	}
	const head = len(stateMagic) + 1 + 4 + 4 + 8
	switch {
	case len(b) < head+4:
		return nil, &StateError{Reason: fmt.Sprintf("truncated: %d bytes", len(b))}
	case string(b[:4]) != stateMagic:
		return nil, &StateError{Reason: fmt.Sprintf("not an outer state (magic %q, want %q)", b[:4], stateMagic)}
	case b[4] != stateVersion:
		return nil, &StateError{Reason: fmt.Sprintf("format version %d, this build reads %d", b[4], stateVersion)}
	}
	body := b[:len(b)-4]
	if got, want := crc32.Checksum(body, castagnoli), binary.LittleEndian.Uint32(b[len(b)-4:]); got != want {
		return nil, &StateError{Reason: fmt.Sprintf("checksum %08x, the state says %08x: corrupt", got, want)}
	}
	rd := &reader{b: body[5:]}
	world, rank := int(rd.u32()), int(rd.u32())
	shared := rd.take(rd.u64())
	var engines [][]byte
	for range l.frags {
		engines = append(engines, rd.take(rd.u64()))
	}
	switch {
	case rd.err != nil:
		return nil, rd.err
	case len(rd.b) != 0:
		return nil, &StateError{Reason: fmt.Sprintf("%d bytes after the last fragment's engine state", len(rd.b))}
	case world < 1 || rank >= world:
		return nil, &StateError{Reason: fmt.Sprintf("saved by rank %d of %d", rank, world)}
	}
	st, err := l.parseShared(shared)
	if err != nil {
		return nil, err
	}
	st.world, st.rank, st.engines = world, rank, engines
	for _, f := range l.frags {
		if err := overlap.CheckState(engines[f.idx], f.cfg, f.sizes, world, comm.Topology{}); err != nil {
			return nil, &StateError{Reason: fmt.Sprintf("fragment %d's engine state", f.idx), Err: err}
		}
	}
	return st, nil
}

// parseShared reads and validates the shared part of a state.
func (l *Loop) parseShared(b []byte) (*state, error) {
	rd := &reader{b: b}
	rec, err := record.Decode(rd.take(uint64(rd.u32())))
	if rd.err != nil {
		return nil, rd.err
	}
	if err != nil {
		return nil, &StateError{Reason: "the configuration record", Err: err}
	}
	if name, saved, current, differ := firstDifference(rec, l.s.record()); differ {
		return nil, &StateError{Field: name, Saved: saved, Current: current}
	}
	st := &state{sharedBytes: b, step: rd.u64(), global: rd.floats(l.s.sizes),
		syncs: make([]*exchange, len(l.frags)), averages: make([][][]float32, len(l.frags))}
	if rd.u8() != boolByte(l.momentum != nil) && rd.err == nil {
		return nil, &StateError{Reason: "the momentum's presence disagrees with the optimizer"}
	}
	if l.momentum != nil {
		st.momentum = rd.floats(l.s.sizes)
	}
	for _, f := range l.frags {
		kind := rd.u8()
		if kind == 0 {
			continue
		}
		x := &exchange{started: rd.u64(), waited: true}
		switch kind {
		case 1:
			st.averages[f.idx] = rd.floats(f.sizes)
		case 2:
			x.nonFinite = &overlap.NonFiniteStepError{Step: rd.u64()}
			n := rd.u32()
			if n > uint32(len(f.sizes)) && rd.err == nil {
				rd.err = &StateError{Reason: fmt.Sprintf("fragment %d's skipped sync names %d buckets of %d", f.idx, n, len(f.sizes))}
			}
			for range min(n, uint32(len(f.sizes))) {
				k := rd.u32()
				x.nonFinite.Buckets = append(x.nonFinite.Buckets, int(k))
				x.nonFinite.Details = append(x.nonFinite.Details, string(rd.take(uint64(rd.u32()))))
				if int(k) >= len(f.sizes) && rd.err == nil {
					rd.err = &StateError{Reason: fmt.Sprintf("fragment %d's skipped sync names bucket %d of %d", f.idx, k, len(f.sizes))}
				}
			}
		default:
			if rd.err == nil {
				rd.err = &StateError{Reason: fmt.Sprintf("fragment %d's sync has kind %d", f.idx, kind)}
			}
		}
		st.syncs[f.idx] = x
	}
	switch {
	case rd.err != nil:
		return nil, rd.err
	case len(rd.b) != 0:
		return nil, &StateError{Reason: fmt.Sprintf("%d bytes after the shared part", len(rd.b))}
	}
	for _, f := range l.frags {
		if want, got := l.s.inFlight(f.idx, st.step), st.syncs[f.idx]; (want == 0) != (got == nil) || got != nil && got.started != want {
			return nil, &StateError{Reason: fmt.Sprintf("fragment %d's sync in flight at step %d is not the schedule's (state: %v, schedule: started at %d, 0 for none)", f.idx, st.step, got != nil, want)}
		}
	}
	return st, nil
}

// reader reads a state's fields; the first error (truncation) sticks and
// later reads return zeros.
type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n uint64) []byte {
	if r.err != nil {
		return nil
	}
	if uint64(len(r.b)) < n {
		r.err = &StateError{Reason: fmt.Sprintf("truncated: %d bytes wanted, %d left", n, len(r.b))}
		return nil
	}
	x := r.b[:n]
	r.b = r.b[n:]
	return x
}

func (r *reader) u8() byte {
	if x := r.take(1); x != nil {
		return x[0]
	}
	return 0
}

func (r *reader) u32() uint32 {
	if x := r.take(4); x != nil {
		return binary.LittleEndian.Uint32(x)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if x := r.take(8); x != nil {
		return binary.LittleEndian.Uint64(x)
	}
	return 0
}

// floats reads one float32 slice per entry of sizes.
func (r *reader) floats(sizes []int) [][]float32 {
	out := make([][]float32, len(sizes))
	for i, n := range sizes {
		x := r.take(4 * uint64(n))
		if x == nil && n > 0 {
			return out
		}
		out[i] = make([]float32, n)
		for j := range out[i] {
			out[i][j] = math.Float32frombits(binary.LittleEndian.Uint32(x[4*j:]))
		}
	}
	return out
}
