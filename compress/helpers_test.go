package compress

import (
	"encoding/binary"
	"hash/crc32"
	"reflect"
	"testing"
)

// Helpers shared by the package's internal tests.

// mustParse is Parse that fails the test on error.
func mustParse(t testing.TB, spec string, opts ...Option) Compressor {
	t.Helper()
	c, err := Parse(spec, opts...)
	if err != nil {
		t.Fatalf("Parse(%q): %v", spec, err)
	}
	return c
}

// payloadBody returns the body of a payload without a lossless stage.
func payloadBody(p []byte) []byte { return p[HeaderLen : len(p)-TrailerLen] }

// reseal recomputes the CRC32C of a payload whose bytes a test changed.
func reseal(p []byte) {
	end := len(p) - TrailerLen
	binary.LittleEndian.PutUint32(p[end:], crc32.Checksum(p[:end], castagnoli))
}

// backend returns the implementation behind c, a Compressor made by
// Parse.
func backend(c Compressor) *compressor {
	b, err := backendOf(c)
	if err != nil {
		panic(err)
	}
	return b
}

// accelerated reports whether the kernel variable kernel holds another
// function than its generic twin: whether this build and CPU have a version
// of it to compare with the twin.
func accelerated(kernel, generic any) bool {
	return reflect.ValueOf(kernel).Pointer() != reflect.ValueOf(generic).Pointer()
}
