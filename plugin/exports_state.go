package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import "unsafe"

// The bodies of the exports that every handle with a checkpoint shares
// (an engine's gc_engine_*, an outer loop's gc_outer_*): destroy, state
// size and state save. T is the handle's type, kind its name in errors.

// closer is a handle whose destroy closes it.
type closer interface{ close() error }

// destroyHandle releases handle h of kind and closes its value.
func destroyHandle[T closer](fn string, h C.uint64_t, kind string) C.int {
	v, err := releaseAs[T](uint64(h), kind)
	if err != nil {
		return C.int(fail(errHandle, fn, "%v", err))
	}
	if err := v.close(); err != nil {
		return C.int(failErr(fn, err))
	}
	return C.int(statusOK)
}

// stateSize writes to *length the length of the state save gives for the
// value of handle h.
func stateSize[T any](fn string, h C.uint64_t, kind string, save func(T) ([]byte, error), length *C.size_t) C.int {
	if length == nil {
		return C.int(fail(errInvalid, fn, "null len"))
	}
	return C.int(withHandle(fn, uint64(h), kind, func(v T) error {
		b, err := save(v)
		if err == nil {
			*length = C.size_t(len(b))
		}
		return err
	}))
}

// stateSave copies the state save gives for the value of handle h into
// the caller's dst of capacity bytes: GC_ERR_SIZE, with *written the
// length needed, when it does not fit.
func stateSave[T any](fn string, h C.uint64_t, kind string, save func(T) ([]byte, error), dst unsafe.Pointer, capacity C.size_t, written *C.size_t) C.int {
	if written == nil {
		return C.int(fail(errInvalid, fn, "null written"))
	}
	*written = 0
	out, err := cBytes(dst, capacity, "dst")
	if err != nil {
		return C.int(failErr(fn, err))
	}
	return C.int(withHandle(fn, uint64(h), kind, func(v T) error {
		b, err := save(v)
		switch {
		case err != nil:
			return err
		case len(out) < len(b):
			*written = C.size_t(len(b))
			return errorf(errSize, "dst holds %d bytes, the state needs %d", len(out), len(b))
		}
		*written = C.size_t(copy(out, b))
		return nil
	}))
}
