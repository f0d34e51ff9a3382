package main

import (
	"fmt"
	"strings"
	"unsafe"
)

// The ABI's size-prefixed input structs (gc_engine_config, gc_outer_config)
// start with a uint32 size, the sizeof of the caller's header: a later
// ABI appends fields, and the library reads as far as the caller's size
// says and no further.

// knownSize is one size of a size-prefixed struct that a caller's header
// may give, with the ABI that introduced it.
type knownSize struct {
	size uint32
	abi  string
}

// copySized returns the struct T (the Go mirror of the C struct name) at
// p: as many bytes as its size field says, the fields after them (which
// an older ABI's struct lacks) zero, each one's default. A size not in
// sizes (ascending, the last T's own) is refused before a byte past the
// size field is read: a larger one is a newer header's, whose fields this
// library does not know, or a wrong one, which would have it read past
// the caller's struct. arg names the argument in the message ("cfg").
func copySized[T any](p unsafe.Pointer, arg, name string, sizes []knownSize) (T, error) {
	var c T
	size := *(*uint32)(p)
	var older []string
	for _, s := range sizes {
		if s.size == size {
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&c)), size), unsafe.Slice((*byte)(p), size))
			return c, nil
		}
		older = append(older, fmt.Sprintf("%d of ABI %s", s.size, s.abi))
	}
	reads := fmt.Sprintf("a %s of %d bytes", name, unsafe.Sizeof(c))
	if len(older) > 1 {
		reads += fmt.Sprintf(" or an older ABI's (%s)", strings.Join(older[:len(older)-1], ", "))
	}
	return c, errorf(errInvalid, "%s->size %d: this library (ABI %d.%d) reads %s; "+
		"a larger size is a newer header's, whose fields it does not know: build against this library's gradcomp.h and set size from it",
		arg, size, abiMajor, abiMinor, reads)
}
