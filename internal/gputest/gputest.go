// Package gputest is the tests' one way to get a GPU resource (a device
// context, a communicator on it): opened once per test binary, handed to
// every test that asks, and a skip with the reason, not a failure, where
// the machine lacks what it needs. It imports nothing of gradcomp, so the
// packages that open the resources (kernels, nccl) use it in their own
// tests too.
package gputest

import (
	"errors"
	"sync"
	"testing"
)

// Opener returns a function that gives each test the resource open makes.
// open runs once, at the first call; when it fails with an error matching
// one of absent (errors.Is: no CUDA in this build, no device, no NCCL),
// every test that asks is skipped with that error, and with any other
// error it fails.
func Opener[T any](open func() (T, error), absent ...error) func(testing.TB) T {
	var (
		once sync.Once
		v    T
		err  error
	)
	return func(tb testing.TB) T {
		tb.Helper()
		once.Do(func() { v, err = open() })
		for _, a := range absent {
			if errors.Is(err, a) {
				tb.Skipf("no GPU resource for this test: %v", err)
			}
		}
		if err != nil {
			tb.Fatal(err)
		}
		return v
	}
}
