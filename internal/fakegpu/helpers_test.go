package fakegpu

import (
	"strings"
	"testing"

	"github.com/gradcomp/gradcomp/gpu"
)

// platform returns a platform of n devices, closed at the test's end.
func platform(t *testing.T, n int) *Platform {
	t.Helper()
	p := New(n)
	t.Cleanup(p.Close)
	return p
}

// alloc allocates n bytes on d or fails the test.
func alloc(t *testing.T, d *Device, n int) gpu.Ptr {
	t.Helper()
	ptr, err := d.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	return ptr
}

// newStream creates a stream on d or fails the test.
func newStream(t *testing.T, d *Device) gpu.Stream {
	t.Helper()
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// wantErr fails the test unless err is an error whose message holds every
// one of parts.
func wantErr(t *testing.T, what string, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error, want one naming %q", what, parts)
		return
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("%s: %v, want it to name %q", what, err, p)
		}
	}
}
