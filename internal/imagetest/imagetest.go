// Package imagetest checks the plots gradcomp writes: that a file is a PNG
// of at least a given size.
package imagetest

import (
	"image/png"
	"os"
	"testing"
)

// CheckPNG fails tb unless path decodes as a PNG at least minW × minH
// pixels, and returns whether it did.
func CheckPNG(tb testing.TB, path string, minW, minH int) bool {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Error(err)
		return false
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		tb.Errorf("%s: %v", path, err)
		return false
	}
	if b := img.Bounds(); b.Dx() < minW || b.Dy() < minH {
		tb.Errorf("%s is %v, want at least %d×%d", path, b, minW, minH)
		return false
	}
	return true
}
