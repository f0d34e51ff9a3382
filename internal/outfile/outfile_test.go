package outfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.txt")
	if err := Write(path, func(w io.Writer) error { _, err := io.WriteString(w, "hello"); return err }); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "hello" {
		t.Fatalf("read back %q, %v", b, err)
	}
	boom := errors.New("boom")
	err := Write(path, func(io.Writer) error { return boom })
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), path) {
		t.Fatalf("got %v, want boom naming %s", err, path)
	}
	if err := Write(filepath.Join(t.TempDir(), "no", "such", "dir"), func(io.Writer) error { return nil }); err == nil {
		t.Fatal("writing into a missing directory succeeded")
	}
}

func TestWriteJSONArray(t *testing.T) {
	var b strings.Builder
	if err := WriteJSONArray[int](&b, nil); err != nil || b.String() != "[]\n" {
		t.Fatalf("nil slice: %q, %v", b.String(), err)
	}
	b.Reset()
	if err := WriteJSONArray(&b, []struct{ A int }{{1}}); err != nil || b.String() != "[\n  {\n    \"A\": 1\n  }\n]\n" {
		t.Fatalf("one item: %q, %v", b.String(), err)
	}
}
