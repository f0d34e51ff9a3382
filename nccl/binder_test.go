package nccl_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/gradcomp/gradcomp/internal/ncclmock"
	"github.com/gradcomp/gradcomp/nccl"
)

// TestWithDeviceBinder: InitRank calls the binder, not the CUDA driver,
// once, and a binder's failure ends InitRank naming the device and rank,
// before NCCL sees anything; bad arguments and Split are refused.
func TestWithDeviceBinder(t *testing.T) {
	l := open(t)
	calls := 0
	c, err := l.InitRank(t.Context(), 1, ncclmock.ID(ncclmock.ModeOK), 0,
		nccl.WithDeviceBinder(3, func() error { calls++; return nil }))
	if err != nil || calls != 1 {
		t.Fatalf("InitRank: %v after %d binder calls, want success after 1", err, calls)
	}
	defer c.Destroy(t.Context())
	if _, err := c.Split(t.Context(), 0, 0, nccl.WithDeviceBinder(3, func() error { return nil })); err == nil ||
		!strings.Contains(err.Error(), "parent's device") {
		t.Errorf("Split with a binder: %v, want a refusal naming the parent's device", err)
	}

	errNoDevice := errors.New("fake device 3 is not there")
	_, err = l.InitRank(t.Context(), 1, ncclmock.ID(ncclmock.ModeOK), 0,
		nccl.WithDeviceBinder(3, func() error { return errNoDevice }))
	if !errors.Is(err, errNoDevice) || !strings.Contains(err.Error(), "ncclCommInitRank on rank 0: binding device 3") {
		t.Errorf("failing binder: got %v", err)
	}
	for _, opt := range []nccl.Option{nccl.WithDeviceBinder(-1, func() error { return nil }), nccl.WithDeviceBinder(0, nil)} {
		if _, err := l.InitRank(t.Context(), 1, ncclmock.ID(ncclmock.ModeOK), 0, opt); err == nil ||
			!strings.Contains(err.Error(), "WithDeviceBinder") {
			t.Errorf("bad WithDeviceBinder: got %v", err)
		}
	}
}

// TestSymbol: Library.Symbol finds the mock's extra export and reports a
// symbol the library lacks.
func TestSymbol(t *testing.T) {
	l := open(t)
	if p, ok := l.Symbol("gcmock_set_device_hooks"); !ok || p == 0 {
		t.Errorf("Symbol(gcmock_set_device_hooks) = %#x, %v", p, ok)
	}
	for _, name := range []string{"gcmock_no_such_symbol", ""} {
		if p, ok := l.Symbol(name); ok || p != 0 {
			t.Errorf("Symbol(%q) = %#x, %v; want 0, false", name, p, ok)
		}
	}
}

// TestIgnoreLoaded: IgnoreLoaded loads the named file even though a copy
// of libnccl.so.2 is loaded (the mock, here), and refuses to run without a
// file to load.
func TestIgnoreLoaded(t *testing.T) {
	open(t)
	l, err := nccl.Open(nccl.IgnoreLoaded(), nccl.WithPath(mockPath))
	if err != nil {
		t.Fatal(err)
	}
	if want := "WithPath(" + mockPath + ")"; l.Source() != want {
		t.Errorf("Source() = %q, want %q (not the loaded copy)", l.Source(), want)
	}
	t.Setenv(nccl.EnvPath, "")
	if _, err := nccl.Open(nccl.IgnoreLoaded()); err == nil || !strings.Contains(err.Error(), "IgnoreLoaded needs") {
		t.Errorf("IgnoreLoaded without a file: %v", err)
	}
}
