package main

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"unsafe"
)

// TestEngineConfigSizes: a gc_engine_config is read as far as its size
// says, an older ABI's size included, and no further: a struct of each
// size the library knows, placed against an unreadable page, is read
// without a fault, its fields past the size zero; any other size (the
// 4 GiB of a caller whose struct was 88 bytes, a newer header's, a size
// between two ABIs') is refused, naming it and this library's size,
// with nothing past the size field readable.
func TestEngineConfigSizes(t *testing.T) {
	page := syscall.Getpagesize()
	mem, err := syscall.Mmap(-1, 0, 2*page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Skipf("mmap: %v", err)
	}
	defer syscall.Munmap(mem)
	if err := syscall.Mprotect(mem[page:], syscall.PROT_NONE); err != nil {
		t.Skipf("mprotect: %v", err)
	}
	counts := []uint64{1}
	full := cEngineConfig{ErrorFeedback: 1, Warmup: 3, Momentum: 0.5, Guard: 1.5, Nodes: 2, TensorCounts: &counts[0], FeedbackDecay: 0.9}
	src := unsafe.Slice((*byte)(unsafe.Pointer(&full)), unsafe.Sizeof(full))
	for _, s := range engineConfigSizes {
		at := page - int(s.size) // the struct ends where the unreadable page begins
		copy(mem[at:page], src)
		*(*uint32)(unsafe.Pointer(&mem[at])) = s.size
		c, err := copyEngineConfig(unsafe.Pointer(&mem[at]))
		if err != nil {
			t.Fatalf("size %d (ABI %s): %v", s.size, s.abi, err)
		}
		has := func(since uint32) bool { return s.size > since }
		if c.Warmup != 3 || (c.Momentum == 0.5) != has(engineConfigSize20) || (c.Guard == 1.5) != has(engineConfigSize21) ||
			(c.Nodes == 2) != has(engineConfigSize22) || (c.TensorCounts != nil) != has(engineConfigSize25) ||
			(c.FeedbackDecay == 0.9) != has(engineConfigSize27) {
			t.Errorf("size %d (ABI %s): read %+v", s.size, s.abi, c)
		}
	}
	own := unsafe.Sizeof(cEngineConfig{})
	for _, size := range []uint32{0, 4, 48, 60, engineConfigSize211 + 8, 1 << 20, 1<<32 - 1} {
		*(*uint32)(unsafe.Pointer(&mem[page-4])) = size // only the size field is readable
		_, err := copyEngineConfig(unsafe.Pointer(&mem[page-4]))
		var se *statusError
		if !errors.As(err, &se) || se.st != errInvalid || !strings.Contains(err.Error(), fmt.Sprintf("cfg->size %d:", size)) ||
			!strings.Contains(err.Error(), fmt.Sprintf("a gc_engine_config of %d bytes", own)) {
			t.Errorf("size %d: %v; want GC_ERR_INVALID naming it and %d", size, err, own)
		}
	}
}
