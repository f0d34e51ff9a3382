// Package ncclmock is a TEST FIXTURE: it compiles a mock libnccl.so.2
// (testdata/*.c, embedded) with the C compiler, so that the tests of
// package nccl and comm/ncclcomm run the binding's real dlopen, dlsym and call
// paths on machines without a GPU. Only _test.go files import it; nothing
// that ships loads the mock (`make mocknccl` builds the same library as a
// file, build/mocknccl/libnccl.so.2, for the Python tests).
//
// It also finds the real NCCL for the tests that use it (RealLibrary,
// RealHeader) and runs such tests in a process of their own (Isolate):
// a process holds one libnccl.so.2, and the mock, once loaded, is it.
//
// The mock implements NCCL's C ABI on host memory: a "device pointer" is a
// host address (Alloc gives memory outside the Go heap). Ranks are
// goroutines of one process or of several processes that share a unique
// id: a world lives in POSIX shared memory named from the id (ShmName),
// and data crosses through staging areas there, in chunks, so buffers of
// any size work; reductions add in rank order. The id's first bytes select
// a behaviour for the whole world (see ID, the Mode constants and
// FailInitID). ncclCommSplit groups a world's ranks by color, ordered by
// key then by their old rank, into new worlds of the same behaviour.
//
// # Streams
//
// Without device hooks streams are ignored and every operation completes
// before it returns. A fake GPU installs hooks through the exported C
// function gcmock_set_device_hooks (find it with nccl.Library.Symbol):
//
//	typedef int (*gcmock_current_device_fn)(void);
//	typedef int (*gcmock_launch_fn)(void *stream, int device, void (*fn)(void *), void *arg,
//	                                char *err, size_t errcap);
//	void gcmock_set_device_hooks(gcmock_current_device_fn current_device, gcmock_launch_fn launch);
//
// With hooks, ncclCommInitRank puts the communicator on current_device()
// of the calling thread (< 0: the init fails with ncclUnhandledCudaError,
// "no current CUDA device on the calling thread"); a split communicator is
// on its parent's device. Each collective, send and receive (at
// ncclGroupEnd, each communicator's queued operations as one unit, on the
// stream of its first) is checked, then handed to launch(stream, device,
// fn, arg, err, errcap), and the NCCL call returns ncclSuccess: the
// launcher calls fn(arg) once, later, in stream order, on its own thread.
// A nonzero launch return fails the call with ncclInvalidUsage and a last
// error that includes err. A failure while fn runs (an abort, hang mode,
// ranks that disagree) becomes the communicator's asynchronous error
// (ncclCommGetAsyncError), as in NCCL. ncclCommDestroy waits for the
// launched units; ncclCommAbort does not. testdata/mocknccl.c documents
// the whole protocol.
package ncclmock

import (
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/nccl"
)

//go:embed testdata/*.c testdata/*.h
var sources embed.FS

// ErrNoCompiler is returned by Build when no C compiler is on PATH (tests
// skip with it as the reason).
var ErrNoCompiler = errors.New("ncclmock: no C compiler (cc or gcc, or $CC) on PATH to build the mock libnccl.so.2")

// CC returns the C compiler the package uses: $CC when set, else cc or gcc
// on PATH; ErrNoCompiler when there is none.
func CC() (string, error) {
	if cc := os.Getenv("CC"); cc != "" {
		return cc, nil
	}
	for _, name := range []string{"cc", "gcc"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", ErrNoCompiler
}

// Build compiles the mock into dir/libnccl.so.2 (soname libnccl.so.2) and
// returns its path. defines are extra -D macros: "MOCK_NO_SEND" for a
// library that lacks ncclSend, "MOCK_NO_SPLIT" for one that lacks
// ncclCommSplit (as NCCL before 2.18), "MOCK_VERSION=30000" for one whose
// ncclGetVersion reports 3.0.0, "MOCK_STAGE_BYTES=4096" for staging areas
// of 4 KiB (buffers cross the world in many chunks). The Makefile's
// mocknccl target builds it the same way.
func Build(dir string, defines ...string) (string, error) {
	cc, err := CC()
	if err != nil {
		return "", err
	}
	files, err := fs.Glob(sources, "testdata/*")
	if err != nil {
		return "", fmt.Errorf("ncclmock: listing the embedded sources: %w", err)
	}
	var cfiles []string
	for _, f := range files {
		data, err := sources.ReadFile(f)
		if err != nil {
			return "", fmt.Errorf("ncclmock: reading embedded %s: %w", f, err)
		}
		dst := filepath.Join(dir, path.Base(f))
		if err := os.WriteFile(dst, data, 0o644); err != nil {
			return "", fmt.Errorf("ncclmock: %w", err)
		}
		if strings.HasSuffix(f, ".c") {
			cfiles = append(cfiles, dst)
		}
	}
	out := filepath.Join(dir, nccl.LibraryName)
	args := []string{"-O1", "-shared", "-fPIC", "-Wl,-soname," + nccl.LibraryName, "-o", out}
	for _, d := range defines {
		args = append(args, "-D"+d)
	}
	args = append(append(args, cfiles...), "-lpthread", "-lrt")
	if msg, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("ncclmock: %s %v: %v\n%s", cc, args, err, msg)
	}
	return out, nil
}

// Modes of a mock world, selected by the unique id (see ID).
const (
	ModeOK    = "ok"    // everything works
	ModeHang  = "hang"  // operations block until the communicator is aborted
	ModeStuck = "stuck" // the same, but they return only 500 ms after the abort
	ModeAsync = "async" // operations succeed, then ncclCommGetAsyncError reports ncclRemoteError
	ModeFail  = "fail"  // operations return ncclInvalidUsage with a last error
)

var idCounter atomic.Uint64

// ID returns a fresh unique id whose world behaves as mode (Mode*). It
// names this process and a counter, so ids of concurrent test processes
// never meet in shared memory.
func ID(mode string) nccl.UniqueID {
	var id nccl.UniqueID
	copy(id[:], fmt.Sprintf("mock:%s:go:%d:%d", mode, os.Getpid(), idCounter.Add(1)))
	return id
}

// FailInitID returns a fresh unique id of a world whose rank rank fails
// ncclCommInitRank (ncclUnhandledCudaError, with a last error), while the
// other ranks wait for it until they are aborted, as NCCL's do for a peer
// that never comes.
func FailInitID(rank int) nccl.UniqueID {
	return ID(fmt.Sprintf("failinit=%d", rank))
}

// ShmName returns the name of the POSIX shared-memory segment (under
// /dev/shm on Linux, without the leading slash) that holds the world of
// id while ranks are joining it: "gcmock-" and the FNV-1a 64 hash of the
// id's 128 bytes in 16 hex digits, as world.c computes it.
func ShmName(id nccl.UniqueID) string {
	h := fnv.New64a()
	h.Write(id[:])
	return fmt.Sprintf("gcmock-%016x", h.Sum64())
}

// Buffer is "device" memory for the mock: anonymous pages outside the Go
// heap, so C may keep their address while the garbage collector runs.
type Buffer struct {
	mem []byte
}

// Alloc maps n bytes (at least one page). Free releases them.
func Alloc(n int) (*Buffer, error) {
	mem, err := syscall.Mmap(-1, 0, max(n, 1), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("ncclmock: mmap %d bytes: %w", n, err)
	}
	return &Buffer{mem: mem[:n]}, nil
}

// Ptr returns the buffer's address as a device pointer.
func (b *Buffer) Ptr() gpu.Ptr {
	return gpu.Ptr(unsafe.Pointer(unsafe.SliceData(b.mem[:cap(b.mem)])))
}

// Bytes returns the buffer's memory.
func (b *Buffer) Bytes() []byte { return b.mem }

// Float32s returns the buffer's memory as float32s (len(Bytes())/4 of them).
func (b *Buffer) Float32s() []float32 {
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b.mem[:cap(b.mem)]))), len(b.mem)/4)
}

// Free unmaps the buffer.
func (b *Buffer) Free() error { return syscall.Munmap(b.mem[:cap(b.mem)]) }

// Memory is the mock's "device" memory as a conformance suite uses it
// (commtest.Memory): buffers from Alloc, copies that complete at once, and
// streams that are always done. It is safe for concurrent use.
type Memory struct {
	mu   sync.Mutex
	bufs map[gpu.Ptr]*Buffer
}

// Alloc returns a buffer of n bytes.
func (m *Memory) Alloc(n int) (gpu.Ptr, error) {
	b, err := Alloc(n)
	if err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.bufs == nil {
		m.bufs = map[gpu.Ptr]*Buffer{}
	}
	m.bufs[b.Ptr()] = b
	return b.Ptr(), nil
}

// buffer returns the buffer p starts, or an error naming p.
func (m *Memory) buffer(p gpu.Ptr) (*Buffer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if b, ok := m.bufs[p]; ok {
		return b, nil
	}
	return nil, fmt.Errorf("ncclmock: %#x is not a buffer of this Memory", uintptr(p))
}

// Free releases the buffer p.
func (m *Memory) Free(p gpu.Ptr) error {
	b, err := m.buffer(p)
	if err != nil {
		return err
	}
	m.mu.Lock()
	delete(m.bufs, p)
	m.mu.Unlock()
	return b.Free()
}

// CopyIn copies src to the start of buffer dst.
func (m *Memory) CopyIn(_ gpu.Stream, dst gpu.Ptr, src []byte) error {
	b, err := m.buffer(dst)
	if err == nil && len(src) > len(b.mem) {
		err = fmt.Errorf("ncclmock: CopyIn of %d bytes into a buffer of %d", len(src), len(b.mem))
	}
	if err != nil {
		return err
	}
	copy(b.mem, src)
	return nil
}

// CopyOut copies the start of buffer src to dst.
func (m *Memory) CopyOut(_ gpu.Stream, dst []byte, src gpu.Ptr) error {
	b, err := m.buffer(src)
	if err == nil && len(dst) > len(b.mem) {
		err = fmt.Errorf("ncclmock: CopyOut of %d bytes from a buffer of %d", len(dst), len(b.mem))
	}
	if err != nil {
		return err
	}
	copy(dst, b.mem)
	return nil
}

// Synced reports true: without device hooks every mock operation
// completes before it returns.
func (m *Memory) Synced(gpu.Stream) (bool, error) { return true, nil }
