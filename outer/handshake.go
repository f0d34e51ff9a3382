package outer

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/overlap"
)

// protocolVersion names the Loop's schedule and update rules; ranks must
// agree on it.
const protocolVersion = 1

// field is one entry of a configuration record.
type field struct{ name, value string }

// record is the canonical form of s that a state records, in the order a
// difference is reported: settings(false), then tensors().
func (s *settings) record() []field { return append(s.settings(false), s.tensors()...) }

// settings are the fields of s but the tensors'; the handshake's add
// OnNonFinite, a run-time policy a resumed run may change.
func (s *settings) settings(handshake bool) []field {
	f := []field{
		{"SyncEvery", strconv.Itoa(s.SyncEvery)},
		{"Fragments", strconv.Itoa(s.Fragments)},
		{"Delay", strconv.Itoa(s.Delay)},
		{"Alpha", strconv.FormatFloat(s.Alpha, 'g', -1, 64)},
		{"Optimizer", s.Optimizer.String()},
		{"BucketElements", strconv.Itoa(s.BucketElements)},
	}
	if handshake {
		f = append(f, field{"OnNonFinite", s.OnNonFinite.String()})
	}
	return f
}

// tensors are the fields of the tensors: their count, then each one's
// elements, fragment and shape.
func (s *settings) tensors() []field {
	f := []field{{"tensors", strconv.Itoa(len(s.sizes))}}
	for i, n := range s.sizes {
		shape := "none"
		if s.Shapes != nil {
			shape = fmt.Sprintf("%d×%d", s.Shapes[i].Rows, s.Shapes[i].Cols)
		}
		f = append(f,
			field{fmt.Sprintf("tensor %d elements", i), strconv.Itoa(n)},
			field{fmt.Sprintf("tensor %d fragment", i), strconv.Itoa(s.fragmentOf[i])},
			field{fmt.Sprintf("tensor %d shape", i), shape})
	}
	return f
}

// firstDifference returns the first field, in order, on which got differs
// from want, with both values ("nothing" for a field one lacks); ok is
// false when they are equal.
func firstDifference(got, want []field) (name, gotValue, wantValue string, ok bool) {
	for i := range max(len(got), len(want)) {
		g, w := field{value: "nothing"}, field{value: "nothing"}
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			return cmp.Or(w.name, g.name), g.value, w.value, true
		}
	}
	return "", "", "", false
}

func encodeRecord(fs []field) []byte {
	var b []byte
	for _, f := range fs {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(f.name)))
		b = append(b, f.name...)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(f.value)))
		b = append(b, f.value...)
	}
	return b
}

func decodeRecord(b []byte) ([]field, error) {
	var fs []field
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
			return nil, errors.New("truncated configuration record")
		}
		fs = append(fs, field{name, value})
	}
	return fs, nil
}

// handshake compares every rank's configuration with rank 0's. It
// all-gathers the settings and a digest of the tensors' fields (a model of
// many tensors costs each rank a few bytes per rank, not its whole list);
// only where the digests differ does a second all-gather of the tensors'
// fields find which differs. A rank whose configuration is invalid
// (invalid, a *ConfigError) sends only why, so that the others fail at
// once naming it, and gets its own error. Each all-gather is bounded by
// timeout.
func handshake(ctx context.Context, c comm.Comm, timeout time.Duration, s *settings, invalid *ConfigError) error {
	rec := []field{{"invalid", ""}, {"protocol version", strconv.Itoa(protocolVersion)}}
	if invalid != nil {
		rec = []field{{"invalid", invalid.Reason}, {"invalid field", invalid.Field}}
	} else {
		digest := sha256.Sum256(encodeRecord(s.tensors()))
		rec = append(append(rec, s.settings(true)...), field{"tensors digest", hex.EncodeToString(digest[:])})
	}
	recs, err := gatherRecords(ctx, c, timeout, rec)
	if invalid != nil {
		return invalid
	}
	if err != nil {
		return err
	}
	for r, fs := range recs {
		if len(fs) < 2 || fs[0].name != "invalid" {
			return fmt.Errorf("outer: handshake: rank %d sent an unreadable record", r)
		}
		if fs[0].value != "" {
			return &ConfigError{Rank: r, Field: fs[1].value, Reason: fs[0].value}
		}
	}
	err = compareRecords(recs)
	if m, ok := err.(*ConfigMismatchError); !ok || m.Field != "tensors digest" {
		return err
	}
	if recs, err = gatherRecords(ctx, c, timeout, s.tensors()); err != nil {
		return err
	}
	return compareRecords(recs)
}

// Refuse takes part in New's handshake for a rank that cannot build its
// Loop because its configuration cannot even be read into a Config or its
// parameters (a front end's parse error: a struct of an unknown size, a
// null pointer), so that the other ranks' New fail at once with a
// *ConfigError naming this rank, invalid's Field and its Reason, instead
// of waiting for this rank until their timeout. It returns invalid, its
// Rank set to c.Rank(), whether or not the others could be told. Each
// all-gather is bounded by ctx and timeout (overlap.DefaultTimeout when
// not positive). New refuses by itself when the Config is invalid.
func Refuse(ctx context.Context, c comm.Comm, timeout time.Duration, invalid *ConfigError) error {
	if c == nil {
		return errors.New("outer: Refuse: nil comm.Comm")
	}
	if invalid == nil {
		invalid = &ConfigError{Field: "configuration", Reason: "no reason given"}
	}
	if timeout <= 0 {
		timeout = overlap.DefaultTimeout
	}
	invalid.Rank = c.Rank()
	return handshake(ctx, c, timeout, nil, invalid)
}

// gatherRecords all-gathers every rank's record rec.
func gatherRecords(ctx context.Context, c comm.Comm, timeout time.Duration, rec []field) ([][]field, error) {
	all, err := allGatherBytes(ctx, c, timeout, encodeRecord(rec))
	if err != nil {
		return nil, err
	}
	recs := make([][]field, len(all))
	for r, b := range all {
		if recs[r], err = decodeRecord(b); err != nil {
			return nil, fmt.Errorf("outer: handshake: rank %d sent an unreadable record: %w", r, err)
		}
	}
	return recs, nil
}

// compareRecords returns the first field, in order, on which the lowest
// rank that differs from rank 0 differs, as a *ConfigMismatchError, or nil.
func compareRecords(recs [][]field) error {
	for r, fs := range recs[1:] {
		if name, mine, theirs, differ := firstDifference(fs, recs[0]); differ {
			return &ConfigMismatchError{Field: name, Rank: r + 1, Value: mine, OtherRank: 0, OtherValue: theirs}
		}
	}
	return nil
}

// allGatherBytes all-gathers every rank's b, whatever its length, and
// returns them by rank. Each of its two all-gathers is bounded by timeout.
func allGatherBytes(ctx context.Context, c comm.Comm, timeout time.Duration, b []byte) ([][]byte, error) {
	n := c.Size()
	gather := func(dst, src []byte) error {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if err := c.AllGather(ctx, dst, src); err != nil {
			return fmt.Errorf("outer: handshake on rank %d: %w", c.Rank(), err)
		}
		return nil
	}
	lens := make([]byte, 8*n)
	if err := gather(lens, binary.LittleEndian.AppendUint64(nil, uint64(len(b)))); err != nil {
		return nil, err
	}
	longest := uint64(0)
	for r := range n {
		longest = max(longest, binary.LittleEndian.Uint64(lens[8*r:]))
	}
	all := make([]byte, uint64(n)*longest)
	if err := gather(all, append(b, make([]byte, longest-uint64(len(b)))...)); err != nil {
		return nil, err
	}
	out := make([][]byte, n)
	for r := range n {
		at := uint64(r) * longest
		out[r] = all[at : at+binary.LittleEndian.Uint64(lens[8*r:])]
	}
	return out, nil
}
