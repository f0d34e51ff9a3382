// Package record is the configuration record that ranks compare when they
// agree on a configuration (overlap's handshake, outer's): named string
// fields in a fixed order, their encoding, an all-gather of every rank's
// record, and the first field on which two records differ.
package record

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/gradcomp/gradcomp/comm"
)

// Field is one setting of a record: its name and its canonical value.
type Field struct{ Name, Value string }

// Encode returns fs as bytes: per field, the name's length (uint32,
// little-endian), the name, the value's length and the value.
func Encode(fs []Field) []byte {
	var b []byte
	for _, f := range fs {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(f.Name)))
		b = append(b, f.Name...)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(f.Value)))
		b = append(b, f.Value...)
	}
	return b
}

// ErrTruncated is Decode's error for bytes that end inside a field.
var ErrTruncated = errors.New("truncated configuration record")

// Decode reads the fields Encode wrote; ErrTruncated when b ends inside a
// field.
func Decode(b []byte) ([]Field, error) {
	var fs []Field
	next := func() (string, bool) {
		if len(b) < 4 {
			return "", false
		}
		l := binary.LittleEndian.Uint32(b)
		if uint64(len(b)-4) < uint64(l) {
			return "", false
		}
		s := string(b[4 : 4+l])
		b = b[4+l:]
		return s, true
	}
	for len(b) > 0 {
		name, ok1 := next()
		value, ok2 := next()
		if !ok1 || !ok2 {
			return nil, ErrTruncated
		}
		fs = append(fs, Field{name, value})
	}
	return fs, nil
}

// FirstDifference returns the first field, in order, on which got and want
// differ (the zero Field for the one a shorter record lacks); differ is
// false when they are equal.
func FirstDifference(got, want []Field) (g, w Field, differ bool) {
	for i := range max(len(got), len(want)) {
		g, w = Field{}, Field{}
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			return g, w, true
		}
	}
	return Field{}, Field{}, false
}

// Gather all-gathers every rank's record fs over c and returns them by
// rank: an all-gather of the encoded lengths, then one of the records
// padded to the longest, each bounded by ctx and timeout. what names the
// caller in its errors ("overlap: handshake"): a failed all-gather is
// "what on rank R: err", a record that does not decode "what: rank R sent
// an unreadable record (err)".
func Gather(ctx context.Context, c comm.Comm, timeout time.Duration, what string, fs []Field) ([][]Field, error) {
	rank, n := c.Rank(), c.Size()
	gather := func(dst, src []byte) error {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if err := c.AllGather(ctx, dst, src); err != nil {
			return fmt.Errorf("%s on rank %d: %w", what, rank, err)
		}
		return nil
	}
	rec := Encode(fs)
	lens := make([]byte, 8*n)
	if err := gather(lens, binary.LittleEndian.AppendUint64(nil, uint64(len(rec)))); err != nil {
		return nil, err
	}
	longest := uint64(0)
	for r := range n {
		longest = max(longest, binary.LittleEndian.Uint64(lens[8*r:]))
	}
	all := make([]byte, uint64(n)*longest)
	if err := gather(all, append(rec, make([]byte, longest-uint64(len(rec)))...)); err != nil {
		return nil, err
	}
	recs := make([][]Field, n)
	for r := range n {
		at := uint64(r) * longest
		got, err := Decode(all[at : at+binary.LittleEndian.Uint64(lens[8*r:])])
		if err != nil {
			return nil, fmt.Errorf("%s: rank %d sent an unreadable record (%v)", what, r, err)
		}
		recs[r] = got
	}
	return recs, nil
}
