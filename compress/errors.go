package compress

import (
	"fmt"
	"strconv"
)

// SpecError reports a spec string Parse cannot accept.
type SpecError struct {
	Spec   string // the spec as given
	Reason string // what is wrong with it
}

func (e *SpecError) Error() string {
	return fmt.Sprintf("compress: bad spec %q: %s", e.Spec, e.Reason)
}

// CorruptInputError reports a payload whose bytes are inconsistent at Offset
// (counted from the start of the payload).
type CorruptInputError struct {
	Offset int64
	Reason string
}

func (e *CorruptInputError) Error() string {
	return "compress: corrupt input at offset " + strconv.FormatInt(e.Offset, 10) + ": " + e.Reason
}

// VersionError reports a payload or checkpoint written in a format version
// this build does not read.
type VersionError struct {
	What      string // "payload" or "error-feedback state"
	Got, Want uint8
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("compress: unsupported %s version %d (this build reads version %d)", e.What, e.Got, e.Want)
}

// ChecksumError reports a payload whose CRC32C does not match its contents.
type ChecksumError struct {
	Got, Want uint32 // stored and computed checksums
}

func (e *ChecksumError) Error() string {
	return fmt.Sprintf("compress: checksum mismatch: payload says %#08x, contents hash to %#08x", e.Got, e.Want)
}

// SizeError reports a length that does not match what the other side of the
// call expects: a destination slice, an element count, a buffer.
type SizeError struct {
	What      string // what was measured, e.g. "destination length"
	Got, Want int64
}

func (e *SizeError) Error() string {
	return fmt.Sprintf("compress: size mismatch: %s is %d, want %d", e.What, e.Got, e.Want)
}

// PayloadMismatchError reports a payload written with a different configuration
// than the compressor asked to read it (another codec, bucket size or seed).
type PayloadMismatchError struct {
	Field     string // the differing header field
	Got, Want string // payload's value, compressor's value
}

func (e *PayloadMismatchError) Error() string {
	return fmt.Sprintf("compress: payload %s is %s, this compressor expects %s", e.Field, e.Got, e.Want)
}

// NonFiniteError reports a NaN or ±Inf in a gradient handed to Compress (or a
// finite value the codec cannot represent, such as |x| > 65504 for fp16).
// Nothing is written to error-feedback memory when it is returned.
type NonFiniteError struct {
	Index int     // element index within the input
	Value float32 // the offending value
}

func (e *NonFiniteError) Error() string {
	return fmt.Sprintf("compress: non-finite or unrepresentable gradient value %v at index %d", e.Value, e.Index)
}
