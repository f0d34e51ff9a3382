package nccl

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrNotFound is matched (errors.Is) by the *LoadError Open returns when no
// libnccl.so.2 could be opened.
var ErrNotFound = errors.New("nccl: libnccl.so.2 not found")

// ErrNoCgo is returned by Open in a program built with CGO_ENABLED=0: the
// package needs cgo (for dlopen) to load NCCL.
var ErrNoCgo = errors.New("nccl: built without cgo (CGO_ENABLED=0), so libnccl.so.2 cannot be loaded; rebuild with CGO_ENABLED=1")

// ErrClosed is matched (errors.Is) by every error of a call on a Comm that
// Destroy or an abort has ended. comm/ncclcomm reports it as comm.ErrClosed,
// as every comm.DeviceComm reports its end.
var ErrClosed = errors.New("nccl: communicator closed")

// dlError is a message from dlerror().
type dlError string

func (e dlError) Error() string { return string(e) }

// Attempt is one way Open tried to load the library, and why it failed.
type Attempt struct {
	What string // e.g. "already loaded (RTLD_NOLOAD libnccl.so.2)", "$GRADCOMP_NCCL=/x/libnccl.so.2"
	Err  error  // dlerror()'s message
}

// ErrIncompatible is matched (errors.Is) by the *LoadError Open returns
// when it opened a library but cannot use it: a function is missing, or
// its version is not NCCL 2.x.
var ErrIncompatible = errors.New("nccl: the library is not a usable NCCL 2.x")

// LoadError reports a library that could not be used. Either none of the
// Attempts opened one (Path == ""; errors.Is(err, ErrNotFound) holds), or
// the library at Path was opened and refused (errors.Is(err,
// ErrIncompatible) holds): it lacks the functions Missing, or
// ncclGetVersion failed (Err), or it reports a major Version other than 2.
type LoadError struct {
	Attempts []Attempt
	Path     string   // the library that was opened and refused; "" when none was opened
	Symbol   string   // the first function in Missing, "" when none is missing
	Missing  []string // the functions the package requires that the library lacks, in the package's order
	Version  Version  // the library's ncclGetVersion; zero when it has none or it failed
	Err      error    // ncclGetVersion's failure (an *Error), nil otherwise
}

func (e *LoadError) Error() string {
	switch {
	case len(e.Missing) > 0 && e.Missing[0] == "ncclGetVersion":
		s := fmt.Sprintf("nccl: %s is not an NCCL library: it has no function ncclGetVersion", e.Path)
		if n := len(e.Missing) - 1; n > 0 {
			s += fmt.Sprintf(", nor %d of the %d other functions the package requires (%s)", n, requiredCount()-1, strings.Join(e.Missing[1:], ", "))
		}
		return s
	case len(e.Missing) > 0:
		what := "function " + e.Missing[0]
		if len(e.Missing) > 1 {
			what = "functions " + strings.Join(e.Missing, ", ")
		}
		ver := ""
		if e.Version.Code != 0 {
			ver = fmt.Sprintf("it is NCCL %v; ", e.Version)
		}
		return fmt.Sprintf("nccl: %s has no %s, which the package calls (%sthe package needs NCCL 2.7 or newer)", e.Path, what, ver)
	case e.Err != nil:
		return fmt.Sprintf("nccl: %s: reading its version: %v", e.Path, e.Err)
	case e.Path != "":
		return fmt.Sprintf("nccl: %s is NCCL %v (ncclGetVersion code %d), but the package calls the C ABI of NCCL 2.x (%s), 2.7 or newer", e.Path, e.Version, e.Version.Code, LibraryName)
	}
	var b strings.Builder
	b.WriteString("nccl: cannot load " + LibraryName + ":")
	for i, a := range e.Attempts {
		if i > 0 {
			b.WriteString(";")
		}
		fmt.Fprintf(&b, " %s: %v", a.What, a.Err)
	}
	b.WriteString(". Install NCCL (for example the nvidia-nccl-cu12 or -cu13 wheel, whose library is in site-packages/nvidia/nccl/lib), then put its directory on LD_LIBRARY_PATH or set " + EnvPath + " to the file")
	return b.String()
}

// Is reports whether target is ErrNotFound and nothing could be opened, or
// ErrIncompatible and a library was opened and refused.
func (e *LoadError) Is(target error) bool {
	return target == ErrNotFound && e.Path == "" || target == ErrIncompatible && e.Path != ""
}

// Unwrap returns Err: ncclGetVersion's failure, nil otherwise.
func (e *LoadError) Unwrap() error { return e.Err }

// Error reports an NCCL function that returned a result other than
// ncclSuccess, or an asynchronous error ncclCommGetAsyncError reported.
type Error struct {
	Func    string // the NCCL function, e.g. "ncclAllReduce", or "ncclCommGetAsyncError"
	Rank    int    // the communicator's rank, -1 when there is none
	Result  Result
	Message string // ncclGetErrorString(Result)
	Detail  string // ncclGetLastError(comm) right after the failure; "" when NCCL < 2.13 or empty
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("nccl: " + e.Func)
	if e.Rank >= 0 {
		fmt.Fprintf(&b, " on rank %d", e.Rank)
	}
	fmt.Fprintf(&b, " failed: %v: %s", e.Result, e.Message)
	if e.Detail != "" {
		b.WriteString(" (last error: " + e.Detail + ")")
	}
	return b.String()
}

// ArgumentError reports a call whose arguments are invalid; it is returned
// before NCCL sees them, and nothing was enqueued.
type ArgumentError struct {
	Func   string // the NCCL function the call was for
	Reason string // what is wrong, with the values
}

func (e *ArgumentError) Error() string {
	return fmt.Sprintf("nccl: %s: invalid argument: %s", e.Func, e.Reason)
}

// AbortError reports a call that this package ended by aborting its
// communicator(s) with ncclCommAbort: the deadline passed or ctx ended
// (Cause is context.DeadlineExceeded or context.Canceled), or NCCL reported
// an asynchronous error (Cause is that *Error). errors.Is(err, ErrClosed)
// holds: the communicators are unusable afterwards.
type AbortError struct {
	Func    string        // the call that was running
	Rank    int           // its communicator's rank, -1 when there was none yet
	Cause   error         // why it was aborted
	Waited  time.Duration // how long the call ran before the abort
	Aborted bool          // ncclCommAbort was called (false: InitRank had no communicator yet, or Destroy was running)
	// AbortErr is ncclCommAbort's own failure, nil when it succeeded.
	AbortErr error
	// Returned says whether the NCCL call returned within the grace period
	// after the abort. When false, the call's thread is still blocked in
	// NCCL and was left behind; buffers it was given must not be reused.
	Returned bool
}

func (e *AbortError) Error() string {
	var b strings.Builder
	b.WriteString("nccl: " + e.Func)
	if e.Rank >= 0 {
		fmt.Fprintf(&b, " on rank %d", e.Rank)
	}
	fmt.Fprintf(&b, " stopped after %v: %v", e.Waited.Round(time.Millisecond), e.Cause)
	switch {
	case !e.Aborted:
		b.WriteString("; nothing was aborted")
	case e.AbortErr != nil:
		fmt.Fprintf(&b, "; ncclCommAbort failed: %v", e.AbortErr)
	default:
		b.WriteString("; the communicator was aborted")
	}
	if !e.Returned {
		b.WriteString("; the NCCL call had not returned after the abort and was left blocked")
	}
	return b.String()
}

// Unwrap returns Cause.
func (e *AbortError) Unwrap() error { return e.Cause }

// Is reports whether target is ErrClosed (when a communicator was aborted).
func (e *AbortError) Is(target error) bool { return target == ErrClosed && e.Aborted }

// DestroyedError reports a call on a Comm that Destroy, Abort or an earlier
// AbortError ended. errors.Is(err, ErrClosed) holds; it wraps the failure
// that ended the Comm (nil after a clean Destroy).
type DestroyedError struct {
	Func  string
	Rank  int
	Cause error
}

func (e *DestroyedError) Error() string {
	if e.Cause == nil {
		return fmt.Sprintf("nccl: %s on rank %d: the communicator was destroyed", e.Func, e.Rank)
	}
	return fmt.Sprintf("nccl: %s on rank %d: the communicator was ended by an earlier failure: %v", e.Func, e.Rank, e.Cause)
}

// Unwrap returns Cause.
func (e *DestroyedError) Unwrap() error { return e.Cause }

// Is reports whether target is ErrClosed.
func (e *DestroyedError) Is(target error) bool { return target == ErrClosed }

// UnsupportedError reports a call that needs an optional NCCL function the
// loaded library lacks because it predates it (ncclCommSplit before NCCL
// 2.18). Open loads such a library; the call fails before NCCL sees
// anything, and its communicator stays usable. errors.Is(err,
// errors.ErrUnsupported) holds.
type UnsupportedError struct {
	Func    string  // the missing NCCL function, e.g. "ncclCommSplit"
	Rank    int     // the communicator's rank, -1 when there is none
	Path    string  // the library
	Version Version // the library's version
	Since   Version // the NCCL release that added Func
}

func (e *UnsupportedError) Error() string {
	var b strings.Builder
	b.WriteString("nccl: " + e.Func)
	if e.Rank >= 0 {
		fmt.Fprintf(&b, " on rank %d", e.Rank)
	}
	fmt.Fprintf(&b, ": %s is NCCL %v, which has no function %s (NCCL %d.%d added it); load NCCL %d.%d or newer (WithPath, $%s)",
		e.Path, e.Version, e.Func, e.Since.Major, e.Since.Minor, e.Since.Major, e.Since.Minor, EnvPath)
	return b.String()
}

// Is reports whether target is errors.ErrUnsupported.
func (e *UnsupportedError) Is(target error) bool { return target == errors.ErrUnsupported }
