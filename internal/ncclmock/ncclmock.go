// Package ncclmock is a TEST FIXTURE: it compiles a mock libnccl.so.2
// (testdata/mocknccl.c, embedded) with the C compiler, so that the tests of
// package nccl and comm/ncclcomm run the binding's real dlopen, dlsym and call
// paths on machines without a GPU. Only _test.go files import it; nothing
// that ships loads the mock.
//
// It also finds the real NCCL for the tests that use it (RealLibrary,
// RealHeader) and runs such tests in a process of their own (Isolate):
// a process holds one libnccl.so.2, and the mock, once loaded, is it.
//
// The mock implements NCCL's C ABI on host memory: a "device pointer" is a
// host address (Alloc gives memory outside the Go heap), streams are
// ignored and every operation completes before it returns. Ranks are
// goroutines of one process that share a unique id; the id's first bytes
// select a behaviour for the whole world (see ID and mocknccl.c).
// ncclCommSplit groups a world's ranks by color, ordered by key then by
// their old rank, into new worlds of the same behaviour.
package ncclmock

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/nccl"
)

//go:embed testdata/mocknccl.c
var source []byte

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
// ncclGetVersion reports 3.0.0.
func Build(dir string, defines ...string) (string, error) {
	cc, err := CC()
	if err != nil {
		return "", err
	}
	src := filepath.Join(dir, "mocknccl.c")
	if err := os.WriteFile(src, source, 0o644); err != nil {
		return "", fmt.Errorf("ncclmock: %w", err)
	}
	out := filepath.Join(dir, nccl.LibraryName)
	args := []string{"-O1", "-shared", "-fPIC", "-Wl,-soname," + nccl.LibraryName, "-o", out}
	for _, d := range defines {
		args = append(args, "-D"+d)
	}
	args = append(args, src, "-lpthread")
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

// ID returns a fresh unique id whose world behaves as mode (Mode*).
func ID(mode string) nccl.UniqueID {
	var id nccl.UniqueID
	copy(id[:], fmt.Sprintf("mock:%s:go:%d", mode, idCounter.Add(1)))
	return id
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

// Synced reports true: every mock operation completes before it returns.
func (m *Memory) Synced(gpu.Stream) (bool, error) { return true, nil }
