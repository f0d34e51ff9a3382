package nccl

import (
	"fmt"
	"os"
	"runtime"
	"unsafe"
)

// LibraryName is the NCCL library's soname, the name Open looks for.
const LibraryName = "libnccl.so.2"

// EnvPath is the environment variable that names the NCCL library file to
// load when no copy is loaded already (see Open).
const EnvPath = "GRADCOMP_NCCL"

// fnID names an NCCL function; the values match gc_call's ids in dl_cgo.go.
type fnID int

const (
	fnGetVersion fnID = iota
	fnGetUniqueID
	fnCommInitRank
	fnCommDestroy
	fnCommAbort
	fnCommGetAsyncError
	fnAllReduce
	fnAllGather
	fnReduceScatter
	fnBroadcast
	fnSend
	fnRecv
	fnGroupStart
	fnGroupEnd
	fnGetErrorString
	fnGetLastError
	fnCommUserRank
	fnCommCount
	fnCommSplit
	fnCount
)

// functions lists each function's symbol and, for an optional one, the
// NCCL_VERSION_CODE of the release that added it (since; 0: every NCCL
// 2.7 has it, and Open requires it). Open loads a library without an
// optional function; the calls that need it fail then, naming it
// (*UnsupportedError).
var functions = [fnCount]struct {
	name  string
	since int
}{
	fnGetVersion:        {"ncclGetVersion", 0},
	fnGetUniqueID:       {"ncclGetUniqueId", 0},
	fnCommInitRank:      {"ncclCommInitRank", 0},
	fnCommDestroy:       {"ncclCommDestroy", 0},
	fnCommAbort:         {"ncclCommAbort", 0},
	fnCommGetAsyncError: {"ncclCommGetAsyncError", 0},
	fnAllReduce:         {"ncclAllReduce", 0},
	fnAllGather:         {"ncclAllGather", 0},
	fnReduceScatter:     {"ncclReduceScatter", 0},
	fnBroadcast:         {"ncclBroadcast", 0},
	fnSend:              {"ncclSend", 0},
	fnRecv:              {"ncclRecv", 0},
	fnGroupStart:        {"ncclGroupStart", 0},
	fnGroupEnd:          {"ncclGroupEnd", 0},
	fnGetErrorString:    {"ncclGetErrorString", 0},
	fnGetLastError:      {"ncclGetLastError", 21300},
	fnCommUserRank:      {"ncclCommUserRank", 0},
	fnCommCount:         {"ncclCommCount", 0},
	fnCommSplit:         {"ncclCommSplit", 21800},
}

func (f fnID) String() string { return functions[f].name }

// required reports whether Open refuses a library without f.
func (f fnID) required() bool { return functions[f].since == 0 }

// requiredCount returns how many functions Open requires.
func requiredCount() int {
	n := 0
	for f := range fnCount {
		if f.required() {
			n++
		}
	}
	return n
}

// Library is a loaded libnccl.so.2. It is safe for concurrent use. A
// library is never unloaded: NCCL keeps threads and CUDA state alive for
// the life of the process.
type Library struct {
	h       uintptr // the dlopen handle
	path    string  // the file, as the dynamic linker reports it
	source  string  // how it was found
	fns     [fnCount]uintptr
	version Version
}

// LoadOption configures Open.
type LoadOption func(*loadOptions) error

type loadOptions struct {
	path         string
	ignoreLoaded bool
}

// WithPath names the NCCL library file Open loads when no copy is loaded
// already; it takes precedence over $GRADCOMP_NCCL. The path must not be
// empty.
func WithPath(path string) LoadOption {
	return func(o *loadOptions) error {
		if path == "" {
			return fmt.Errorf("nccl: WithPath: empty path")
		}
		o.path = path
		return nil
	}
}

// IgnoreLoaded makes Open skip a copy of NCCL the process has loaded
// already and load the file WithPath or $GRADCOMP_NCCL names beside it,
// with its own symbols (RTLD_LOCAL). It is for test builds whose NCCL is
// a mock (internal/ncclmock) in a process where PyTorch has loaded the
// real library; a program that runs NCCL must not hold two copies.
// Without a path it is refused.
func IgnoreLoaded() LoadOption {
	return func(o *loadOptions) error {
		o.ignoreLoaded = true
		return nil
	}
}

var errNotLoaded = dlError("no copy is loaded in this process")

// Open loads NCCL and resolves its functions. It tries, in order:
//
//  1. a copy already loaded in the process (dlopen of "libnccl.so.2" with
//     RTLD_NOLOAD), such as the one PyTorch loaded: one process must not
//     hold two NCCLs, so this copy always wins;
//  2. the file named by WithPath, else by $GRADCOMP_NCCL, when either is
//     set; a failure here is final, so an explicit choice is never
//     silently replaced by another library;
//  3. otherwise "libnccl.so.2" on the dynamic linker's search path
//     (LD_LIBRARY_PATH, the ld.so cache).
//
// When nothing loads, the error is a *LoadError listing every attempt with
// dlerror's message (errors.Is(err, ErrNotFound)). A library that loads but
// cannot be used is a *LoadError too (errors.Is(err, ErrIncompatible)):
// one without a function the package requires (Missing; a library that is
// not NCCL at all lacks ncclGetVersion), or one whose ncclGetVersion fails
// or reports a major version other than 2; Open closes it again. A library
// that lacks only optional functions of later releases (ncclGetLastError,
// 2.13; ncclCommSplit, 2.18) loads. Without cgo, Open returns ErrNoCgo.
func Open(opts ...LoadOption) (*Library, error) {
	var o loadOptions
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if !cgoEnabled {
		return nil, ErrNoCgo
	}
	type candidate struct {
		name   string
		noload bool
		what   string
	}
	var cands []candidate
	env := os.Getenv(EnvPath)
	switch {
	case !o.ignoreLoaded:
		cands = append(cands, candidate{LibraryName, true, "already loaded (RTLD_NOLOAD " + LibraryName + ")"})
	case o.path == "" && env == "":
		return nil, fmt.Errorf("nccl: IgnoreLoaded needs the library's file: WithPath or $%s", EnvPath)
	}
	switch {
	case o.path != "":
		cands = append(cands, candidate{o.path, false, "WithPath(" + o.path + ")"})
	case env != "":
		cands = append(cands, candidate{env, false, "$" + EnvPath + "=" + env})
	default:
		cands = append(cands, candidate{LibraryName, false, "search path (" + LibraryName + ")"})
	}
	var attempts []Attempt
	for _, c := range cands {
		h, err := dlopen(c.name, c.noload)
		if err != nil {
			if c.noload {
				err = errNotLoaded
			}
			attempts = append(attempts, Attempt{c.what, err})
			continue
		}
		return load(h, c.what)
	}
	return nil, &LoadError{Attempts: attempts}
}

// load resolves the functions of the opened library h and reads its
// version. It refuses, with a *LoadError, and closes h, a library that
// lacks a required function or whose major version is not 2.
func load(h uintptr, source string) (*Library, error) {
	l := &Library{h: h, source: source, path: dlhandlePath(h)}
	if l.path == "" {
		l.path = source
	}
	var missing []string
	for f := range fnCount {
		if l.fns[f] = dlsym(h, functions[f].name); l.fns[f] == 0 && f.required() {
			missing = append(missing, functions[f].name)
		}
	}
	var code int32
	r := ResultSuccess
	if l.fns[fnGetVersion] != 0 {
		r = ccall(l.fns[fnGetVersion], fnGetVersion, &[7]uintptr{}, unsafe.Pointer(&code), nil)
	}
	var version Version
	if r == ResultSuccess && l.fns[fnGetVersion] != 0 {
		version = VersionFromCode(int(code))
	}
	switch {
	case len(missing) > 0:
		dlclose(h)
		return nil, &LoadError{Path: l.path, Symbol: missing[0], Missing: missing, Version: version}
	case r != ResultSuccess:
		err := l.errorf(fnGetVersion, -1, r, 0)
		dlclose(h)
		return nil, &LoadError{Path: l.path, Err: err}
	case version.Major != 2:
		dlclose(h)
		return nil, &LoadError{Path: l.path, Version: version}
	}
	l.version = version
	return l, nil
}

// Path returns the file the library was loaded from.
func (l *Library) Path() string { return l.path }

// Source says how Open found the library: "already loaded (…)",
// "WithPath(…)", "$GRADCOMP_NCCL=…" or "search path (…)".
func (l *Library) Source() string { return l.source }

// Symbol returns the address of the symbol name in the loaded library
// (dlsym), and false when it has none. It is for a library's optional
// extras beyond NCCL's API, such as the mock's gcmock_set_device_hooks
// (see internal/ncclmock); calling what it returns is the caller's
// business, through cgo.
func (l *Library) Symbol(name string) (uintptr, bool) {
	if name == "" {
		return 0, false
	}
	p := dlsym(l.h, name)
	return p, p != 0
}

// Version returns the library's version (ncclGetVersion). It never fails.
func (l *Library) Version() Version { return l.version }

// ErrorString returns ncclGetErrorString(r).
func (l *Library) ErrorString(r Result) string {
	return cstring(l.fns[fnGetErrorString], fnGetErrorString, uintptr(uint32(r)))
}

// GetUniqueID returns a new ncclUniqueId (ncclGetUniqueId). Call it on one
// rank and hand the id to every rank's InitRank. NCCL may open a listening
// socket here (its bootstrap root), so call it once per communicator. It
// needs no GPU; it fails (an *Error) when NCCL cannot set up its bootstrap,
// for example without a usable network interface.
func (l *Library) GetUniqueID() (UniqueID, error) {
	id := new(UniqueID)
	if r := ccall(l.fns[fnGetUniqueID], fnGetUniqueID, &[7]uintptr{}, unsafe.Pointer(id), nil); r != ResultSuccess {
		return UniqueID{}, l.errorf(fnGetUniqueID, -1, r, 0)
	}
	return *id, nil
}

// errorf builds the *Error of function f that returned r on the
// communicator comm (0 when none) of rank rank. Call it on the thread that
// made the failing call: ncclGetLastError is per thread.
func (l *Library) errorf(f fnID, rank int, r Result, comm uintptr) *Error {
	e := &Error{Func: f.String(), Rank: rank, Result: r, Message: l.ErrorString(r)}
	if fn := l.fns[fnGetLastError]; fn != 0 {
		e.Detail = cstring(fn, fnGetLastError, comm)
	}
	return e
}

// unsupported returns the *UnsupportedError of the optional function f,
// which the library lacks, for a call on rank rank (-1 when none).
func (l *Library) unsupported(f fnID, rank int) *UnsupportedError {
	return &UnsupportedError{Func: f.String(), Rank: rank, Path: l.path, Version: l.version, Since: VersionFromCode(functions[f].since)}
}

// lockedCall runs f on a locked OS thread, so that per-thread NCCL state
// (group depth, the last-error buffer) sees one thread throughout.
func lockedCall[T any](f func() T) T {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return f()
}
