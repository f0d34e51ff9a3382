package main

/*
#include "lasterror.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime/debug"
	"unicode/utf8"
	"unsafe"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/hosted"
	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/kernels"
	"github.com/gradcomp/gradcomp/nccl"
	"github.com/gradcomp/gradcomp/outer"
	"github.com/gradcomp/gradcomp/overlap"
)

// errorBufLen is the size of lasterror.c's per-thread buffer, NUL included.
const errorBufLen = 1024

// fail records msg as the calling thread's last error, prefixed with the
// export's name, and returns st.
func fail(st status, fn, format string, args ...any) status {
	setLastError(fn + ": " + fmt.Sprintf(format, args...))
	return st
}

// failErr records err, prefixed with the export's name, and returns the
// status its type maps to (statusOf).
func failErr(fn string, err error) status {
	return fail(statusOf(err), fn, "%v", err)
}

// statusError is an error the plugin itself detects, with its status code.
type statusError struct {
	st  status
	msg string
}

func (e *statusError) Error() string { return e.msg }

// errorf returns a *statusError with status st.
func errorf(st status, format string, args ...any) error {
	return &statusError{st: st, msg: fmt.Sprintf(format, args...)}
}

// statusOf maps an error to its status code: a *statusError's own, else
// that of outer's, overlap's, comm's, compress's and kernels' typed errors. An error
// of no known type is a bug in gradcomp: GC_ERR_INTERNAL.
func statusOf(err error) status {
	if st, ok := outerStatus(err); ok {
		return st
	}
	if st, ok := engineStatus(err); ok {
		return st
	}
	var (
		spec     *compress.SpecError
		nonFin   *compress.NonFiniteError
		size     *compress.SizeError
		mismatch *compress.PayloadMismatchError
		corrupt  *compress.CorruptInputError
		checksum *compress.ChecksumError
		ver      *compress.VersionError
		driver   *kernels.DriverError
		arg      *kernels.ArgumentError
	)
	switch {
	case errors.Is(err, kernels.ErrNoCUDA):
		return errNoCUDA
	case errors.Is(err, kernels.ErrNoDevice):
		return errNoDevice
	case errors.As(err, &driver):
		return errCUDA
	case errors.As(err, &arg):
		return errInvalid
	case errors.As(err, &spec):
		return errSpec
	case errors.As(err, &nonFin):
		return errNonFinite
	case errors.As(err, &mismatch):
		return errMismatch
	case errors.As(err, &size):
		return errSize
	case errors.As(err, &corrupt), errors.As(err, &checksum), errors.As(err, &ver):
		return errCorrupt
	}
	return errInternal
}

// outerStatus maps the errors of package outer's Loop; ok is false for
// others (among them the Loop's failed exchanges, which wrap the engine's
// and the transport's errors). A *outer.BrokenError wraps the failure that
// broke the Loop, so it comes first; a *outer.NonFiniteSyncError wraps
// the engine's *overlap.NonFiniteStepError, which maps alike.
func outerStatus(err error) (status, bool) {
	var (
		broken   *outer.BrokenError
		config   *outer.ConfigError
		mismatch *outer.ConfigMismatchError
		state    *outer.StateError
	)
	switch {
	case errors.As(err, &broken):
		return errBroken, true
	case errors.Is(err, outer.ErrClosed):
		return errClosed, true
	case errors.As(err, &config), errors.As(err, &mismatch):
		return errConfig, true
	case errors.As(err, &state):
		return errCorrupt, true
	}
	return 0, false
}

// engineStatus maps the errors of the engine and its transport; ok is
// false for others. Order matters: a *overlap.BrokenError wraps the step
// failure that broke the engine, a step failure wraps the comm error,
// which may wrap the *statusError of a host's failed completion, and a
// rank's own *overlap.ConfigError wraps its reason (a *statusError where
// gc_engine_config did not parse).
func engineStatus(err error) (st status, ok bool) {
	var (
		own      *statusError
		broken   *overlap.BrokenError
		nonFin   *overlap.NonFiniteStepError
		usage    *overlap.UsageError
		mismatch *overlap.ConfigMismatchError
		config   *overlap.ConfigError
		topology *overlap.TopologyError
		memory   *overlap.MemoryError
		state    *overlap.StateError
		stepErr  *overlap.StepError
		host     *hosted.HostError
		protocol *hosted.ProtocolError
		inc      *comm.IncompleteError
		poisoned *comm.PoisonedError
	)
	switch {
	case errors.As(err, &broken): // before own: the cause may carry a host's status
		return errBroken, true
	case errors.As(err, &memory): // before config: this rank's *overlap.ConfigError wraps it
		return errNoMem, true
	case errors.As(err, &mismatch), errors.As(err, &config), errors.As(err, &topology): // before own: this rank's wraps its reason
		return errConfig, true
	case errors.As(err, &own):
		return own.st, true
	case errors.As(err, &nonFin):
		return errNonFinite, true
	case errors.As(err, &usage):
		switch {
		case errors.Is(err, overlap.ErrEngineClosed):
			return errClosed, true
		case errors.Is(err, overlap.ErrLength):
			return errSize, true
		}
		return errState, true
	case errors.As(err, &state):
		return errCorrupt, true
	case errors.As(err, &stepErr), errors.As(err, &host), errors.As(err, &protocol), errors.As(err, &inc), errors.As(err, &poisoned):
		return errComm, true
	}
	if st, ok := ncclStatus(err); ok { // before ErrClosed: an NCCL abort matches it
		return st, true
	}
	if errors.Is(err, comm.ErrClosed) {
		return errClosed, true
	}
	return 0, false
}

// setLastError copies msg, cut to the buffer at a UTF-8 boundary, into the
// calling thread's last-error buffer. The Go string is only read during the
// call, so no C copy is allocated.
func setLastError(msg string) {
	if len(msg) >= errorBufLen {
		msg = cutUTF8(msg, errorBufLen-1)
	}
	if msg == "" {
		C.gc_set_last_error(nil, 0)
		return
	}
	C.gc_set_last_error((*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)))
}

// cutUTF8 returns s cut to at most n bytes at a UTF-8 boundary.
func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// guard turns a panic in the export fn into GC_ERR_INTERNAL with the panic
// value and the stack's first frames as the message. Every export defers it
// first, directly, so that its recover sees the panic:
//
//	func gc_x(...) (st C.int) {
//		defer guard("gc_x", &st)
func guard[T ~int32](fn string, st *T) {
	if r := recover(); r != nil {
		*st = T(fail(errInternal, fn, "internal error, please report: panic: %v\n%s", r, debug.Stack()))
	}
}

// ncclStatus maps the errors of the NCCL binding; ok is false for others.
// A communicator that timed out or was aborted (a dead or stalled peer)
// is GC_ERR_COMM, as a failed collective of a transport is; a library
// that does not load, a call NCCL refuses or one the library lacks is
// GC_ERR_NCCL; a device that cannot be made current is GC_ERR_CUDA.
func ncclStatus(err error) (status, bool) {
	var (
		abort *nccl.AbortError
		load  *nccl.LoadError
		call  *nccl.Error
		arg   *nccl.ArgumentError
		unsup *nccl.UnsupportedError
		cuda  *nccl.CUDAError
	)
	switch {
	case errors.As(err, &abort):
		return errComm, true
	case errors.As(err, &cuda):
		return errCUDA, true
	case errors.As(err, &load), errors.As(err, &call), errors.As(err, &unsup):
		return errNCCL, true
	case errors.As(err, &arg):
		return errInvalid, true
	}
	return 0, false
}
