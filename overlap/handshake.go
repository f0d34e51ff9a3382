package overlap

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"

	"github.com/gradcomp/gradcomp/compress"
)

// protocolVersion names the engine's exchange protocol (slot format,
// statuses, keys, strategies). Ranks must agree on it. The device slots'
// guard block (Config.Guard) did not change it: only a guarded
// configuration, which the record compares and which no earlier device
// engine accepted, has one.
const protocolVersion = 1

// field is one entry of a rank's handshake record.
type field struct{ name, value string }

// handshakeRecord lists what every rank must agree on, in the order a
// mismatch is reported; invalid is this rank's configuration error.
func handshakeRecord(e *core, sizes []int, invalid error) []field {
	reason := ""
	if invalid != nil {
		reason = invalid.Error()
	}
	spec := e.spec
	if spec == "" {
		spec = e.cfg.Spec
	}
	onOff := func(b bool) string {
		if b {
			return "on"
		}
		return "off"
	}
	f := []field{
		{"invalid", reason},
		{"protocol version", strconv.Itoa(protocolVersion)},
		{"random stream", compress.RandomStreamVersion}, // stochastic rounding's draws
		{"spec", spec},
		{"strategy", e.strategy.String()},
		{"error feedback", onOff(e.cfg.ErrorFeedback)},
		{"decision", e.cfg.Decision.String()},
		{"fail on non-finite", onOff(e.cfg.FailOnNonFinite)},
		{"warm-up steps", strconv.Itoa(e.cfg.Warmup)},
		{"momentum", strconv.FormatFloat(e.cfg.Momentum, 'g', -1, 64)},
		{"momentum masking", onOff(e.cfg.MomentumMasking)},
		{"schedule", schedule(e)},
		{"accuracy guard", strconv.FormatFloat(e.cfg.Guard, 'g', -1, 64)},
		{"buckets", strconv.Itoa(len(sizes))},
	}
	for i, n := range sizes {
		f = append(f, field{fmt.Sprintf("bucket %d elements", i), strconv.Itoa(n)})
	}
	return f
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
			return nil, fmt.Errorf("truncated handshake record")
		}
		fs = append(fs, field{name, value})
	}
	return fs, nil
}

// handshake exchanges every rank's record (an all-gather of the lengths,
// then of the records padded to the longest) and compares them. It runs
// even when this rank's configuration is invalid, so that the other ranks
// fail at once instead of waiting for it.
func handshake(ctx context.Context, e *core, sizes []int, invalid error) error {
	c, n := e.host, e.size
	rec := encodeRecord(handshakeRecord(e, sizes, invalid))
	timeout := e.cfg.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	gather := func(dst, src []byte) error {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if err := c.AllGather(ctx, dst, src); err != nil {
			return fmt.Errorf("overlap: handshake on rank %d: %w", e.rank, err)
		}
		return nil
	}
	lens := make([]byte, 8*n)
	if err := gather(lens, binary.LittleEndian.AppendUint64(nil, uint64(len(rec)))); err != nil {
		return err
	}
	longest := 0
	for r := range n {
		longest = max(longest, int(binary.LittleEndian.Uint64(lens[8*r:])))
	}
	all := make([]byte, n*longest)
	if err := gather(all, append(rec, make([]byte, longest-len(rec))...)); err != nil {
		return err
	}
	recs := make([][]field, n)
	for r := range n {
		l := int(binary.LittleEndian.Uint64(lens[8*r:]))
		fs, err := decodeRecord(all[r*longest : r*longest+l])
		if err != nil || len(fs) == 0 || fs[0].name != "invalid" {
			return fmt.Errorf("overlap: handshake: rank %d sent an unreadable record (%v)", r, err)
		}
		recs[r] = fs
	}
	if invalid != nil {
		return &ConfigError{Rank: e.rank, Reason: invalid.Error()}
	}
	for r, fs := range recs {
		if fs[0].value != "" {
			return &ConfigError{Rank: r, Reason: fs[0].value}
		}
	}
	return compareRecords(recs)
}

// compareRecords returns the first field, in record order, on which the
// lowest rank that differs from rank 0 differs.
func compareRecords(recs [][]field) error {
	ref := recs[0]
	for r, fs := range recs[1:] {
		for i := range max(len(fs), len(ref)) {
			var mine, theirs field
			if i < len(fs) {
				mine = fs[i]
			}
			if i < len(ref) {
				theirs = ref[i]
			}
			if mine != theirs {
				name := theirs.name
				if name == "" {
					name = mine.name
				}
				return &ConfigMismatchError{Field: name, Rank: r + 1, Value: orNone(mine.value), OtherRank: 0, OtherValue: orNone(theirs.value)}
			}
		}
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "nothing"
	}
	return s
}

// schedule is the handshake's view of the compression warm-up: the phases
// with canonical specs ("none" without one).
func schedule(e *core) string {
	if e.phases == nil {
		return "none"
	}
	ps := make([]Phase, len(e.phases)-1)
	for i := range ps {
		ps[i] = Phase{Steps: e.cfg.Schedule[i].Steps, Spec: e.phases[i].spec}
	}
	return FormatSchedule(ps)
}
