package outer

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/internal/record"
	"github.com/gradcomp/gradcomp/overlap"
)

// protocolVersion names the Loop's schedule and update rules; ranks must
// agree on it.
const protocolVersion = 1

// field is one entry of a configuration record.
type field = record.Field

// record is the canonical form of s that a state records, in the order a
// difference is reported: settings(false), then tensors().
func (s *settings) record() []field { return append(s.settings(false), s.tensors()...) }

// settings are the fields of s but the tensors'; the handshake's add
// OnNonFinite, a run-time policy a resumed run may change.
func (s *settings) settings(handshake bool) []field {
	f := []field{
		{Name: "SyncEvery", Value: strconv.Itoa(s.SyncEvery)},
		{Name: "Fragments", Value: strconv.Itoa(s.Fragments)},
		{Name: "Delay", Value: strconv.Itoa(s.Delay)},
		{Name: "Alpha", Value: strconv.FormatFloat(s.Alpha, 'g', -1, 64)},
		{Name: "Optimizer", Value: s.Optimizer.String()},
		{Name: "BucketElements", Value: strconv.Itoa(s.BucketElements)},
	}
	if handshake {
		f = append(f, field{Name: "OnNonFinite", Value: s.OnNonFinite.String()})
	}
	return f
}

// tensors are the fields of the tensors: their count, then each one's
// elements, fragment and shape.
func (s *settings) tensors() []field {
	f := []field{{Name: "tensors", Value: strconv.Itoa(len(s.sizes))}}
	for i, n := range s.sizes {
		shape := "none"
		if s.Shapes != nil {
			shape = fmt.Sprintf("%d×%d", s.Shapes[i].Rows, s.Shapes[i].Cols)
		}
		f = append(f,
			field{Name: fmt.Sprintf("tensor %d elements", i), Value: strconv.Itoa(n)},
			field{Name: fmt.Sprintf("tensor %d fragment", i), Value: strconv.Itoa(s.fragmentOf[i])},
			field{Name: fmt.Sprintf("tensor %d shape", i), Value: shape})
	}
	return f
}

// firstDifference returns the first field, in order, on which got differs
// from want, with both values ("nothing" for a field one lacks); ok is
// false when they are equal.
func firstDifference(got, want []field) (name, gotValue, wantValue string, ok bool) {
	g, w, differ := record.FirstDifference(got, want)
	if !differ {
		return "", "", "", false
	}
	value := func(f field) string {
		if f.Name == "" {
			return "nothing"
		}
		return f.Value
	}
	return cmp.Or(w.Name, g.Name), value(g), value(w), true
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
	rec := []field{{Name: "invalid", Value: ""}, {Name: "protocol version", Value: strconv.Itoa(protocolVersion)}}
	if invalid != nil {
		rec = []field{{Name: "invalid", Value: invalid.Reason}, {Name: "invalid field", Value: invalid.Field}}
	} else {
		digest := sha256.Sum256(record.Encode(s.tensors()))
		rec = append(append(rec, s.settings(true)...), field{Name: "tensors digest", Value: hex.EncodeToString(digest[:])})
	}
	recs, err := gatherRecords(ctx, c, timeout, rec)
	if invalid != nil {
		return invalid
	}
	if err != nil {
		return err
	}
	for r, fs := range recs {
		if len(fs) < 2 || fs[0].Name != "invalid" {
			return fmt.Errorf("outer: handshake: rank %d sent an unreadable record", r)
		}
		if fs[0].Value != "" {
			return &ConfigError{Rank: r, Field: fs[1].Value, Reason: fs[0].Value}
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
	return record.Gather(ctx, c, timeout, "outer: handshake", rec)
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
