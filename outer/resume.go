package outer

import (
	"context"
	"encoding/binary"
	"fmt"
)

// How Load's ranks agree on the states they were given: each tells the
// others what it holds (a digest), every rank draws the same conclusion
// from the same digests, and, on another number of ranks, the ranks
// without a state get the shared part from one that has it.

// A digest's status.
const (
	digestNone    = iota // the rank passed no state
	digestOK             // its state is valid here
	digestRefused        // its state (or its Loop) cannot take part
)

// digest is what one rank tells the others about the state it passed to
// Load.
type digest struct {
	status      byte
	world, rank uint32 // where the state was saved
	step        uint64 // its inner step
	crc         uint32 // CRC32C of its shared part
	length      uint64 // the shared part's length
}

const digestLen = 32

// gatherDigests all-gathers every rank's digest; a failure breaks the Loop.
func (l *Loop) gatherDigests(ctx context.Context, d digest) ([]digest, error) {
	b := make([]byte, digestLen)
	b[0] = d.status
	binary.LittleEndian.PutUint32(b[4:], d.world)
	binary.LittleEndian.PutUint32(b[8:], d.rank)
	binary.LittleEndian.PutUint64(b[12:], d.step)
	binary.LittleEndian.PutUint32(b[20:], d.crc)
	binary.LittleEndian.PutUint64(b[24:], d.length)
	all := make([]byte, digestLen*l.c.Size())
	gctx, cancel := context.WithTimeout(ctx, l.s.timeout())
	defer cancel()
	if err := l.c.AllGather(gctx, all, b); err != nil {
		return nil, l.fail(fmt.Errorf("outer: Load on rank %d: agreeing on the states: %w", l.c.Rank(), err))
	}
	ds := make([]digest, l.c.Size())
	for q := range ds {
		x := all[digestLen*q:]
		ds[q] = digest{status: x[0], world: binary.LittleEndian.Uint32(x[4:]), rank: binary.LittleEndian.Uint32(x[8:]),
			step: binary.LittleEndian.Uint64(x[12:]), crc: binary.LittleEndian.Uint32(x[20:]), length: binary.LittleEndian.Uint64(x[24:])}
	}
	return ds, nil
}

// agreeStates draws Load's conclusion from every rank's digest, the same
// on every rank: the lowest rank with a state (src), whether the engines
// must reshape (a rank without a state, or states of another number of
// ranks), or why the states cannot be loaded (this rank's own error,
// mine, where it refused).
func agreeStates(ds []digest, world int, mine error) (src int, reshape bool, err error) {
	for q, d := range ds {
		if d.status == digestRefused {
			if mine != nil {
				return 0, false, mine
			}
			return 0, false, &StateError{Reason: fmt.Sprintf("rank %d cannot load its state (its Load says why)", q)}
		}
	}
	src = -1
	savedBy := make(map[uint32]int)
	for q, d := range ds {
		if d.status != digestOK {
			reshape = true
			continue
		}
		if int(d.world) != world {
			reshape = true
		}
		if p, dup := savedBy[d.rank]; dup {
			return 0, false, &StateError{Reason: fmt.Sprintf("ranks %d and %d both passed the state of saved rank %d", p, q, d.rank)}
		}
		savedBy[d.rank] = q
		if src < 0 {
			src = q
			continue
		}
		s := ds[src]
		switch {
		case d.world != s.world:
			return 0, false, &StateError{Reason: fmt.Sprintf("rank %d's state was saved on %d ranks, rank %d's on %d", q, d.world, src, s.world)}
		case d.step != s.step:
			return 0, false, &StateError{Reason: fmt.Sprintf("rank %d's state is at inner step %d, rank %d's at %d", q, d.step, src, s.step)}
		case d.crc != s.crc || d.length != s.length:
			return 0, false, &StateError{Reason: fmt.Sprintf("rank %d's state holds other global weights, momentum or syncs than rank %d's", q, src)}
		}
	}
	if src < 0 {
		return 0, false, &StateError{Reason: "no rank passed a state"}
	}
	return src, reshape, nil
}

// shareState broadcasts the shared part of rank src's state (its digest
// d) to every rank and returns this rank's state: st where it has one,
// else the shared part alone, validated.
func (l *Loop) shareState(ctx context.Context, st *state, d digest, src int) (*state, error) {
	buf := make([]byte, d.length)
	if st != nil {
		copy(buf, st.sharedBytes)
	}
	bctx, cancel := context.WithTimeout(ctx, l.s.timeout())
	defer cancel()
	if err := l.c.Broadcast(bctx, buf, src); err != nil {
		return nil, fmt.Errorf("outer: Load on rank %d: the shared state from rank %d: %w", l.c.Rank(), src, err)
	}
	if st != nil {
		return st, nil
	}
	return l.parseShared(buf)
}
