package compress_test

import (
	"testing"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/compress/compresstest"
)

// TestConformance runs the shared conformance suite on the CPU reference.
func TestConformance(t *testing.T) {
	compresstest.Run(t, func(s string) (compress.Compressor, error) { return compress.Parse(s) })
}
