package nccl

import (
	"fmt"

	"github.com/gradcomp/gradcomp/gpu"
)

// Op is one NCCL operation, described but not yet enqueued: Comm.Run
// enqueues one or a group, Library.Group a group across communicators. Make
// it with AllReduce, AllGather, ReduceScatter, Broadcast, Send or Recv; the
// zero Op is invalid.
//
// Counts are in elements of the data type. Buffers are device addresses
// NCCL reads and writes on the op's stream after it is enqueued: they must
// stay allocated, and the stream must not be destroyed, until the stream
// has passed the op.
type Op struct {
	fn     fnID // fnAllReduce … fnRecv; 0 (fnGetVersion) in the zero Op
	send   gpu.Ptr
	recv   gpu.Ptr
	count  int
	dtype  DataType
	red    RedOp
	peer   int // Broadcast's root, Send's and Recv's peer
	stream gpu.Stream
}

// AllReduce is ncclAllReduce: recv, on every rank, is the element-wise
// reduction op of every rank's send (count elements each). send == recv is
// in place.
func AllReduce(send, recv gpu.Ptr, count int, t DataType, op RedOp, s gpu.Stream) Op {
	return Op{fn: fnAllReduce, send: send, recv: recv, count: count, dtype: t, red: op, stream: s}
}

// AllGather is ncclAllGather: recv (size·sendCount elements) holds every
// rank's send in rank order. send == recv + rank·sendCount is in place.
func AllGather(send, recv gpu.Ptr, sendCount int, t DataType, s gpu.Stream) Op {
	return Op{fn: fnAllGather, send: send, recv: recv, count: sendCount, dtype: t, stream: s}
}

// ReduceScatter is ncclReduceScatter: send has size·recvCount elements on
// every rank, and recv on rank r is block r of the element-wise reduction
// op of every rank's send.
func ReduceScatter(send, recv gpu.Ptr, recvCount int, t DataType, op RedOp, s gpu.Stream) Op {
	return Op{fn: fnReduceScatter, send: send, recv: recv, count: recvCount, dtype: t, red: op, stream: s}
}

// Broadcast is ncclBroadcast: recv, on every rank, is root's send (count
// elements). send is only read on the root and may be 0 elsewhere.
func Broadcast(send, recv gpu.Ptr, count int, t DataType, root int, s gpu.Stream) Op {
	return Op{fn: fnBroadcast, send: send, recv: recv, count: count, dtype: t, peer: root, stream: s}
}

// Send is ncclSend: count elements of buf to rank peer, which must post the
// matching Recv. Sends and receives that depend on each other (an exchange
// between two ranks) must be enqueued in one group (Comm.Run with several
// ops) or they deadlock.
func Send(buf gpu.Ptr, count int, t DataType, peer int, s gpu.Stream) Op {
	return Op{fn: fnSend, send: buf, count: count, dtype: t, peer: peer, stream: s}
}

// Recv is ncclRecv: count elements from rank peer into buf (see Send).
func Recv(buf gpu.Ptr, count int, t DataType, peer int, s gpu.Stream) Op {
	return Op{fn: fnRecv, recv: buf, count: count, dtype: t, peer: peer, stream: s}
}

// String describes the op: its NCCL function and arguments.
func (o Op) String() string {
	switch o.fn {
	case fnAllReduce, fnReduceScatter:
		return fmt.Sprintf("%v(send=%#x, recv=%#x, count=%d, %v, %v, stream=%#x)", o.fn, o.send, o.recv, o.count, o.dtype, o.red, o.stream)
	case fnAllGather:
		return fmt.Sprintf("%v(send=%#x, recv=%#x, sendcount=%d, %v, stream=%#x)", o.fn, o.send, o.recv, o.count, o.dtype, o.stream)
	case fnBroadcast:
		return fmt.Sprintf("%v(send=%#x, recv=%#x, count=%d, %v, root=%d, stream=%#x)", o.fn, o.send, o.recv, o.count, o.dtype, o.peer, o.stream)
	case fnSend:
		return fmt.Sprintf("%v(buf=%#x, count=%d, %v, peer=%d, stream=%#x)", o.fn, o.send, o.count, o.dtype, o.peer, o.stream)
	case fnRecv:
		return fmt.Sprintf("%v(buf=%#x, count=%d, %v, peer=%d, stream=%#x)", o.fn, o.recv, o.count, o.dtype, o.peer, o.stream)
	}
	return "nccl.Op{} (zero value)"
}

// check validates o for a communicator of size ranks on rank rank.
func (o Op) check(rank, size int) error {
	bad := func(format string, args ...any) error {
		name := "nccl.Op"
		if o.fn >= fnAllReduce && o.fn <= fnRecv {
			name = o.fn.String()
		}
		return &ArgumentError{Func: name, Reason: fmt.Sprintf(format, args...)}
	}
	if o.fn < fnAllReduce || o.fn > fnRecv {
		return bad("the zero Op (make ops with AllReduce, AllGather, …)")
	}
	if !o.dtype.valid() {
		return bad("unknown data type %v", o.dtype)
	}
	if o.count < 0 {
		return bad("negative count %d", o.count)
	}
	if (o.fn == fnAllReduce || o.fn == fnReduceScatter) && !o.red.valid() {
		return bad("unknown reduction %v", o.red)
	}
	if (o.fn == fnBroadcast || o.fn == fnSend || o.fn == fnRecv) && (o.peer < 0 || o.peer >= size) {
		what := "peer"
		if o.fn == fnBroadcast {
			what = "root"
		}
		return bad("%s %d out of range [0, %d)", what, o.peer, size)
	}
	if o.count == 0 {
		return nil
	}
	needSend := o.fn != fnRecv && (o.fn != fnBroadcast || o.peer == rank)
	needRecv := o.fn != fnSend
	switch {
	case needSend && o.send == 0:
		return bad("null send buffer with count %d", o.count)
	case needRecv && o.recv == 0:
		return bad("null recv buffer with count %d", o.count)
	}
	return nil
}

// args returns o's arguments in gc_call's layout, with comm in a[5].
func (o Op) args(comm uintptr) *[7]uintptr {
	return &[7]uintptr{uintptr(o.send), uintptr(o.recv), uintptr(o.count), uintptr(o.dtype), o.fourth(), comm, uintptr(o.stream)}
}

// fourth is the argument after the data type: the reduction, or the root or peer.
func (o Op) fourth() uintptr {
	if o.fn == fnAllReduce || o.fn == fnReduceScatter {
		return uintptr(o.red)
	}
	return uintptr(o.peer)
}
