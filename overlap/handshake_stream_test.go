package overlap

import (
	"testing"

	"github.com/gradcomp/gradcomp/compress"
)

// TestHandshakeRandomStream: the handshake compares the random stream's
// definition, right after the protocol version.
func TestHandshakeRandomStream(t *testing.T) {
	f := handshakeRecord(&core{}, []int{4})
	if len(f) < 3 || f[2] != (field{Name: "random stream", Value: compress.RandomStreamVersion}) {
		t.Fatalf("handshake record %v: want field 2 to be the random stream %q", f, compress.RandomStreamVersion)
	}
}
