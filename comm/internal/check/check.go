// Package check holds the argument checks every comm implementation shares:
// the local checks of one rank's call, the cross-rank agreement of matched
// calls, and the guard against overlapping calls on one Comm.
package check

import (
	"fmt"
	"strconv"
	"sync"
	"unsafe"

	"github.com/gradcomp/gradcomp/comm"
)

// Call is one rank's collective call as compared across ranks.
type Call struct {
	Op   comm.Op
	Len  int   // the length that must agree across ranks (see lenName)
	Root int   // Broadcast's root; 0 for the other operations
	Err  error // the rank's own *comm.ArgumentError, nil when its arguments are valid
}

// lenName names the length a Call of op compares.
func lenName(op comm.Op) string {
	switch op {
	case comm.OpAllReduce, comm.OpBroadcast:
		return "len(buf)"
	case comm.OpReduceScatter:
		return "len(dst)"
	}
	return "len(src)"
}

func invalid(c *Call, rank int, format string, args ...any) {
	c.Err = &comm.ArgumentError{Op: c.Op, Rank: rank, Reason: fmt.Sprintf(format, args...)}
}

// AllReduce checks an AllReduce call (every buffer is valid).
func AllReduce(buf []float32) Call {
	return Call{Op: comm.OpAllReduce, Len: len(buf)}
}

// AllGather checks that len(dst) == size*len(src) and that they do not overlap.
func AllGather(rank, size int, dst, src []byte) Call {
	c := Call{Op: comm.OpAllGather, Len: len(src)}
	switch {
	case len(dst) != size*len(src):
		invalid(&c, rank, "len(dst) = %d, want Size() × len(src) = %d × %d = %d", len(dst), size, len(src), size*len(src))
	case overlap(dst, src):
		invalid(&c, rank, "dst and src overlap")
	}
	return c
}

// ReduceScatter checks that len(src) == size*len(dst) and that they do not overlap.
func ReduceScatter(rank, size int, dst, src []float32) Call {
	c := Call{Op: comm.OpReduceScatter, Len: len(dst)}
	switch {
	case len(src) != size*len(dst):
		invalid(&c, rank, "len(src) = %d, want Size() × len(dst) = %d × %d = %d", len(src), size, len(dst), size*len(dst))
	case overlap(dst, src):
		invalid(&c, rank, "dst and src overlap")
	}
	return c
}

// AllToAll checks that len(dst) == len(src) is a multiple of size and that
// they do not overlap.
func AllToAll(rank, size int, dst, src []byte) Call {
	c := Call{Op: comm.OpAllToAll, Len: len(src)}
	switch {
	case len(dst) != len(src):
		invalid(&c, rank, "len(dst) = %d, len(src) = %d, want them equal", len(dst), len(src))
	case len(src)%size != 0:
		invalid(&c, rank, "len(src) = %d is not a multiple of Size() = %d", len(src), size)
	case overlap(dst, src):
		invalid(&c, rank, "dst and src overlap")
	}
	return c
}

// Broadcast checks that 0 <= root < size.
func Broadcast(rank, size int, buf []byte, root int) Call {
	c := Call{Op: comm.OpBroadcast, Len: len(buf), Root: root}
	if root < 0 || root >= size {
		invalid(&c, rank, "root = %d, want 0 <= root < Size() = %d", root, size)
	}
	return c
}

// Barrier returns the Call of a Barrier.
func Barrier() Call { return Call{Op: comm.OpBarrier} }

// Agree returns the error every rank reports for the matched calls calls[r]
// of ranks r = 0, 1, …, or nil when they agree: the invalid arguments of the
// lowest rank that has some, else the first disagreement with rank 0 in
// operation, length or root.
func Agree(calls []Call) error {
	for _, c := range calls {
		if c.Err != nil {
			return c.Err
		}
	}
	c0 := calls[0]
	for r, c := range calls[1:] {
		r++
		mismatch := func(what, a, b string) error {
			return &comm.MismatchError{Op: c0.Op, What: what, RankA: 0, ValueA: a, RankB: r, ValueB: b}
		}
		switch {
		case c.Op != c0.Op:
			return mismatch("operation", c0.Op.String(), c.Op.String())
		case c.Len != c0.Len:
			return mismatch(lenName(c0.Op), strconv.Itoa(c0.Len), strconv.Itoa(c.Len))
		case c.Root != c0.Root:
			return mismatch("root", strconv.Itoa(c0.Root), strconv.Itoa(c.Root))
		}
	}
	return nil
}

// overlap reports whether a and b share memory.
func overlap[T any](a, b []T) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	size := unsafe.Sizeof(a[0])
	a0 := uintptr(unsafe.Pointer(unsafe.SliceData(a)))
	b0 := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return a0 < b0+uintptr(len(b))*size && b0 < a0+uintptr(len(a))*size
}

// Guard rejects overlapping calls on one Comm, and starts beyond a
// Starter's bound. The zero value is ready.
type Guard struct {
	mu      sync.Mutex
	pending comm.Op       // the call in flight, 0 when idle
	done    chan struct{} // closed when the call in flight exits
	started int           // collectives started and not yet finished
}

// Start counts one started collective op of rank, or returns a
// *comm.BusyError when a blocking call is in flight or inFlight started
// collectives are outstanding. Every successful Start needs one Finish.
func (g *Guard) Start(op comm.Op, rank, inFlight int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.pending != 0:
		return &comm.BusyError{Op: op, Rank: rank, Pending: g.pending}
	case g.started >= inFlight:
		return &comm.BusyError{Op: op, Rank: rank, Started: inFlight}
	}
	g.started++
	return nil
}

// Finish ends what one successful Start counted.
func (g *Guard) Finish() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.started--
}

// Enter marks op as in flight on rank, or returns a *comm.BusyError naming
// the call already in flight. Every successful Enter needs one Exit.
func (g *Guard) Enter(op comm.Op, rank int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.pending != 0 {
		return &comm.BusyError{Op: op, Rank: rank, Pending: g.pending}
	}
	g.pending, g.done = op, make(chan struct{})
	return nil
}

// Exit marks the call in flight as finished.
func (g *Guard) Exit() {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.done)
	g.pending, g.done = 0, nil
}

// Idle returns a channel that is closed once no call is in flight (at
// once, when none is).
func (g *Guard) Idle() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.done != nil {
		return g.done
	}
	ch := make(chan struct{})
	close(ch)
	return ch
}
