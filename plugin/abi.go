package main

import (
	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/hosted"
	"github.com/gradcomp/gradcomp/outer"
	"github.com/gradcomp/gradcomp/overlap"
)

// The constants of include/gradcomp.h, in Go. They are not read through
// cgo: the go command does not track headers outside the package directory,
// so a changed header would leave a stale build. abi_test.go reads the
// header and checks every value here against it, and that the header
// declares exactly the functions this package exports.
//
// The exports (exports.go) use plain C integer types in their signatures
// (C.int for gc_status and gc_settle_mode, which are int-sized enums;
// C.uint64_t for gc_compressor): cgo cannot spell the header's const
// qualifiers, and a preamble holding both the header and cgo's own
// declarations of the same functions would not compile.

// The ABI version, GRADCOMP_ABI_MAJOR and GRADCOMP_ABI_MINOR.
const (
	abiMajor   = 2
	abiMinor   = 11
	abiVersion = abiMajor<<16 | abiMinor
)

// The flags of gc_compress.
const (
	flagFeedback = 1 // GC_FEEDBACK
	flagDefer    = 2 // GC_DEFER
)

// The bits of gc_features (since ABI 1.2).
const (
	featureCUDA       = 1 // GC_FEATURE_CUDA: the device calls run (libgradcomp_cuda.so)
	featureFakeDevice = 2 // GC_FEATURE_FAKE_DEVICE: a test build whose engine runs on the fake device
)

// The gc_settle_mode values.
const (
	settleCommit  = 0 // GC_COMMIT
	settleRetain  = 1 // GC_RETAIN
	settleDiscard = 2 // GC_DISCARD
)

// status is a gc_status value.
type status int32

// The gc_status values.
const (
	statusOK     status = 0  // GC_OK
	errInvalid   status = 1  // GC_ERR_INVALID
	errSpec      status = 2  // GC_ERR_SPEC
	errHandle    status = 3  // GC_ERR_HANDLE
	errSize      status = 4  // GC_ERR_SIZE
	errCorrupt   status = 5  // GC_ERR_CORRUPT
	errNonFinite status = 6  // GC_ERR_NONFINITE
	errMismatch  status = 7  // GC_ERR_MISMATCH
	errState     status = 8  // GC_ERR_STATE
	errInternal  status = 9  // GC_ERR_INTERNAL
	errNoCUDA    status = 10 // GC_ERR_NOCUDA (since ABI 1.2)
	errNoDevice  status = 11 // GC_ERR_NODEVICE (since ABI 1.2)
	errCUDA      status = 12 // GC_ERR_CUDA (since ABI 1.2)
	errTimeout   status = 13 // GC_ERR_TIMEOUT (since ABI 2.0)
	errClosed    status = 14 // GC_ERR_CLOSED (since ABI 2.0)
	errComm      status = 15 // GC_ERR_COMM (since ABI 2.0)
	errConfig    status = 16 // GC_ERR_CONFIG (since ABI 2.0)
	errBroken    status = 17 // GC_ERR_BROKEN (since ABI 2.0)
	errNoMem     status = 18 // GC_ERR_NOMEM (since ABI 2.3)
	errNCCL      status = 19 // GC_ERR_NCCL (since ABI 2.9)
)

// The group ids of gc_op.group (since ABI 2.4): hosted's.
const (
	groupWorld = hosted.GroupWorld // GC_GROUP_WORLD
	groupNode  = hosted.GroupNode  // GC_GROUP_NODE
	groupCross = hosted.GroupCross // GC_GROUP_CROSS
)

// The gc_op_kind values: comm.Op's, which hosted.Op carries.
const (
	opAllReduce     = int64(comm.OpAllReduce)     // GC_OP_ALLREDUCE
	opAllGather     = int64(comm.OpAllGather)     // GC_OP_ALLGATHER
	opReduceScatter = int64(comm.OpReduceScatter) // GC_OP_REDUCESCATTER
	opAllToAll      = int64(comm.OpAllToAll)      // GC_OP_ALLTOALL
	opBroadcast     = int64(comm.OpBroadcast)     // GC_OP_BROADCAST
	opBarrier       = int64(comm.OpBarrier)       // GC_OP_BARRIER
)

// The gc_name_list values (since ABI 2.10): the lists gc_name reads.
const (
	namesStrategy  = 0 // GC_NAMES_STRATEGY
	namesDecision  = 1 // GC_NAMES_DECISION
	namesOrigin    = 2 // GC_NAMES_ORIGIN
	namesCaution   = 3 // GC_NAMES_CAUTION
	namesGuard     = 4 // GC_NAMES_GUARD
	namesOptimizer = 5 // GC_NAMES_OUTER_OPTIMIZER (since ABI 2.11)
)

// The gc_outer_optimizer values (since ABI 2.11): outer.OptimizerKind's.
const (
	outerNesterov = int64(outer.Nesterov) // GC_OUTER_NESTEROV
	outerSGD      = int64(outer.SGD)      // GC_OUTER_SGD
	outerNone     = int64(outer.None)     // GC_OUTER_NONE
)

// The gc_outer_nonfinite values (since ABI 2.11): outer.NonFinitePolicy's.
const (
	outerSkip = int64(outer.SkipNonFinite) // GC_OUTER_SKIP
	outerFail = int64(outer.FailNonFinite) // GC_OUTER_FAIL
)

// The gc_origin values (since ABI 2.10): overlap.Origin's.
const (
	originCodec        = int64(overlap.OriginCodec)        // GC_ORIGIN_CODEC
	originPinned       = int64(overlap.OriginPinned)       // GC_ORIGIN_PINNED
	originCostModel    = int64(overlap.OriginCostModel)    // GC_ORIGIN_COST_MODEL
	originVerification = int64(overlap.OriginVerification) // GC_ORIGIN_VERIFICATION
	originWarmup       = int64(overlap.OriginWarmup)       // GC_ORIGIN_WARMUP
	originTrial        = int64(overlap.OriginTrial)        // GC_ORIGIN_TRIAL
	originGuard        = int64(overlap.OriginGuard)        // GC_ORIGIN_GUARD
	originFallback     = int64(overlap.OriginFallback)     // GC_ORIGIN_FALLBACK
)

// The gc_caution values (since ABI 2.10): overlap.Caution's.
const (
	cautionNone         = int64(overlap.CautionNone)         // GC_CAUTION_NONE
	cautionRandomKRatio = int64(overlap.CautionRandomKRatio) // GC_CAUTION_RANDOMK_RATIO
)

// The gc_guard_state values (since ABI 2.10): overlap.GuardState's.
const (
	guardOff     = int64(overlap.GuardOff)     // GC_GUARD_OFF
	guardClear   = int64(overlap.GuardClear)   // GC_GUARD_CLEAR
	guardTripped = int64(overlap.GuardTripped) // GC_GUARD_TRIPPED
	guardPending = int64(overlap.GuardPending) // GC_GUARD_PENDING
)

// version is the library version gc_version returns.
const version = "0.1.0"
