package comm

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Op names a collective in errors. Its numeric value is exchanged between
// ranks by implementations that check calls against each other, so the
// values never change.
type Op uint8

// The collectives.
const (
	OpAllReduce     Op = 1
	OpAllGather     Op = 2
	OpReduceScatter Op = 3
	OpAllToAll      Op = 4
	OpBroadcast     Op = 5
	OpBarrier       Op = 6
	// OpDup is a collective that makes a new communicator from an existing
	// one, such as mpi.Comm.Dup.
	OpDup Op = 7
)

var opNames = [...]string{
	OpAllReduce: "AllReduce", OpAllGather: "AllGather", OpReduceScatter: "ReduceScatter",
	OpAllToAll: "AllToAll", OpBroadcast: "Broadcast", OpBarrier: "Barrier", OpDup: "Dup",
}

// String returns the method name, or "Op(N)" for an unknown value.
func (o Op) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return "Op(" + strconv.Itoa(int(o)) + ")"
}

// ErrClosed is matched (errors.Is) by every error caused by Close.
var ErrClosed = errors.New("comm: communicator closed")

// ArgumentError reports a call whose own arguments are invalid on rank Rank,
// before any data moved. Implementations that tell the other ranks about it
// return the same error there too.
type ArgumentError struct {
	Op     Op
	Rank   int    // the rank whose arguments are invalid
	Reason string // what is wrong, with the values
}

func (e *ArgumentError) Error() string {
	return fmt.Sprintf("comm: %v: invalid argument on rank %d: %s", e.Op, e.Rank, e.Reason)
}

// MismatchError reports matched calls that disagree across ranks: a
// different operation, length or root. Every rank of the call gets the same
// error; no data moved, and the Comm stays usable.
type MismatchError struct {
	Op     Op     // the operation rank RankA called
	What   string // what differs, e.g. "len(buf)", "root", "operation"
	RankA  int
	ValueA string // RankA's value
	RankB  int
	ValueB string // RankB's value
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("comm: %v: ranks disagree on %s: rank %d passed %s, rank %d passed %s",
		e.Op, e.What, e.RankA, e.ValueA, e.RankB, e.ValueB)
}

// IncompleteError reports a collective that ctx ended before every rank had
// taken part. It wraps ctx.Err(): errors.Is(err, context.DeadlineExceeded)
// or context.Canceled holds. The Comm is poisoned afterwards.
type IncompleteError struct {
	Op      Op
	Rank    int   // the rank that gave up
	Missing []int // ranks that had not arrived, ascending; nil when unknown
	Err     error // ctx.Err()
}

func (e *IncompleteError) Error() string {
	var who string
	switch len(e.Missing) {
	case 0:
		who = "the ranks that had not arrived are unknown"
	case 1:
		who = "rank " + strconv.Itoa(e.Missing[0]) + " had not arrived"
	default:
		s := make([]string, len(e.Missing))
		for i, r := range e.Missing {
			s[i] = strconv.Itoa(r)
		}
		who = "ranks " + strings.Join(s, ", ") + " had not arrived"
	}
	return fmt.Sprintf("comm: %v on rank %d did not complete (%s): %v", e.Op, e.Rank, who, e.Err)
}

func (e *IncompleteError) Unwrap() error { return e.Err }

// PoisonedError reports a call on a Comm that an earlier failure (an
// abandoned collective, a closed rank, a transport error) made unusable. It
// fails at once and wraps that first failure.
type PoisonedError struct {
	Op    Op
	Rank  int   // the rank making this call
	Cause error // the first failure
}

func (e *PoisonedError) Error() string {
	return fmt.Sprintf("comm: %v on rank %d: communicator unusable after an earlier failure: %v", e.Op, e.Rank, e.Cause)
}

func (e *PoisonedError) Unwrap() error { return e.Cause }

// ClosedError is the failure a Close causes: Rank closed its end of the
// group. errors.Is(err, ErrClosed) holds.
type ClosedError struct {
	Rank int // the rank that called Close
}

func (e *ClosedError) Error() string {
	return fmt.Sprintf("comm: communicator closed by rank %d", e.Rank)
}

// Is reports whether target is ErrClosed.
func (e *ClosedError) Is(target error) bool { return target == ErrClosed }

// BusyError reports a call made while another call was still in flight on
// the same Comm (see the package doc). Nothing happened; the Comm stays
// usable.
type BusyError struct {
	Op      Op // the rejected call
	Rank    int
	Pending Op // the call in flight; 0 when Started is set
	// Started, when non-zero, is the Starter's InFlight(): the rejected
	// start found that many collectives started and not yet waited for.
	Started int
}

func (e *BusyError) Error() string {
	if e.Started > 0 {
		return fmt.Sprintf("comm: %v on rank %d: %d started collectives are outstanding, this Comm's InFlight(); Wait for one first",
			e.Op, e.Rank, e.Started)
	}
	return fmt.Sprintf("comm: %v on rank %d: %v is still in flight on this Comm; calls on one Comm must not overlap (use a separate Comm per stream)",
		e.Op, e.Rank, e.Pending)
}
