package imagetest

import (
	"image"
	"image/png"
	"os"
	"path/filepath"
	"testing"
)

func TestCheckPNG(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "a.png")
	f, err := os.Create(good)
	if err != nil {
		t.Fatal(err)
	}
	if err := png.Encode(f, image.NewGray(image.Rect(0, 0, 30, 20))); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if !CheckPNG(t, good, 30, 20) {
		t.Error("a 30×20 PNG failed the check")
	}
	bad := filepath.Join(dir, "b.png")
	os.WriteFile(bad, []byte("not a png"), 0o644)
	for _, c := range []struct {
		path       string
		minW, minH int
	}{{bad, 1, 1}, {good, 31, 20}, {filepath.Join(dir, "none.png"), 1, 1}} {
		t.Run(filepath.Base(c.path), func(t *testing.T) {
			ft := &fakeTB{TB: t}
			if CheckPNG(ft, c.path, c.minW, c.minH) || !ft.failed {
				t.Errorf("CheckPNG(%s, %d, %d) passed", c.path, c.minW, c.minH)
			}
		})
	}
}

// fakeTB records a failure instead of failing the test.
type fakeTB struct {
	testing.TB
	failed bool
}

func (f *fakeTB) Errorf(string, ...any) { f.failed = true }
func (f *fakeTB) Error(...any)          { f.failed = true }
func (f *fakeTB) Helper()               {}
