package compresstest

import (
	"encoding/binary"
	"hash/crc32"

	"github.com/gradcomp/gradcomp/compress"
)

// The framing facts of the wire format (documented in package compress) that
// the corruption checks rely on.
const (
	headerLen  = compress.HeaderLen
	trailerLen = compress.TrailerLen
	countOff   = 8  // uint64 element count
	bodyLenOff = 48 // uint64 stored body length
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Reseal rewrites the body-length field and the trailing CRC32C of payload p
// in place so that they match its other bytes, which lets a corruption test or
// a fuzzer reach the checks of the codec's body behind the framing checks.
// A p shorter than a frame (60 bytes) is left as is.
func Reseal(p []byte) {
	if len(p) < headerLen+trailerLen {
		return
	}
	end := len(p) - trailerLen
	binary.LittleEndian.PutUint64(p[bodyLenOff:], uint64(end-headerLen))
	binary.LittleEndian.PutUint32(p[end:], crc32.Checksum(p[:end], castagnoli))
}

// payloadLen returns the element count in the header of a payload the suite
// compressed itself.
func payloadLen(p []byte) int {
	return int(binary.LittleEndian.Uint64(p[countOff:]))
}
