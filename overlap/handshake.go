package overlap

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/compress"
)

// protocolVersion names the engine's exchange protocol (slot format,
// statuses, keys, strategies). Ranks must agree on it. 2: the slot head
// both backends send (parts.go), where 1 had a 12-byte status on the host.
const protocolVersion = 2

// field is one entry of a rank's handshake record.
type field struct{ name, value string }

// handshakeRecord lists what every rank must agree on, in the order a
// mismatch is reported. Its first field, "invalid", is empty: a rank whose
// configuration is invalid sends invalidRecord instead.
func handshakeRecord(e *core, sizes []int) []field {
	f := []field{
		{"invalid", ""},
		{"protocol version", strconv.Itoa(protocolVersion)},
		{"random stream", compress.RandomStreamVersion}, // stochastic rounding's draws
		{"spec", e.spec},
		{"strategy", e.strategy.String()},
		{"layout", layoutName(e.layout)},
		{"shape", shapeName(e.trials)},
		{"node spec", nodeSpecName(e.cfg.NodeSpec)},
		{"error feedback", onOff(e.cfg.ErrorFeedback)},
		{"decision", e.cfg.Decision.String()},
		{"fail on non-finite", onOff(e.cfg.FailOnNonFinite)},
		{"warm-up steps", strconv.Itoa(e.cfg.Warmup)},
		{"momentum", strconv.FormatFloat(e.cfg.Momentum, 'g', -1, 64)},
		{"momentum masking", onOff(e.cfg.MomentumMasking)},
		{"schedule", cmp.Or(schedule(e), "none")},
		{"accuracy guard", strconv.FormatFloat(e.cfg.Guard, 'g', -1, 64)},
		{"feedback decay", formatFloat(e.cfg.decay())}, // β, 1 for none (FeedbackDecay 0)
		{"buckets", strconv.Itoa(len(sizes))},
	}
	for i, n := range sizes {
		f = append(f, field{fmt.Sprintf("bucket %d elements", i), strconv.Itoa(n)})
		f = append(f, field{fmt.Sprintf("bucket %d shapes", i), shapesName(e.cfg.Shapes, i)})
	}
	return f
}

// shapeName says how the engine takes its shape: "chosen by trial" when
// New times flat and hierarchical steps (every rank must, or none would).
func shapeName(trials bool) string {
	if trials {
		return "chosen by trial"
	}
	return "as configured"
}

// nodeSpecName is Config.NodeSpec's canonical form, "fp32" for the
// default (a NodeSpec checkConfig refused never reaches a record).
func nodeSpecName(spec string) string {
	if c, err := nodeCodec(spec); err == nil && c != nil {
		return c.Spec().String()
	}
	return "fp32"
}

// invalidRecord is the record of a rank whose configuration is invalid:
// the reason alone (the other fields would not be compared).
func invalidRecord(reason error) []field { return []field{{"invalid", reason.Error()}} }

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

// handshake runs New's handshake for e, whose configuration is invalid
// when invalid is not nil (then it tells the others, as Refuse does).
func handshake(ctx context.Context, e *core, sizes []int, invalid error) error {
	if invalid != nil {
		return agree(ctx, e.host, e.cfg.Timeout, invalidRecord(invalid), invalid)
	}
	return agree(ctx, e.host, e.cfg.Timeout, handshakeRecord(e, sizes), nil)
}

// Refuse takes part in the handshake of New (or NewDevice) for a rank that
// cannot build its engine, so that the other ranks fail at once with a
// *ConfigError naming this rank and reason, instead of waiting for it until
// their timeout. It returns this rank's *ConfigError, whose Err is reason,
// whether or not the others could be told (the all-gathers are bounded by
// timeout each, DefaultTimeout when it is not positive). Use it where the
// configuration cannot even be read into a Config (a front end's parse
// error); New and NewDevice refuse by themselves when the Config is invalid.
// A nil reason refuses with "no reason given".
func Refuse(ctx context.Context, c comm.Comm, timeout time.Duration, reason error) error {
	if c == nil {
		return fmt.Errorf("overlap: Refuse: nil comm.Comm")
	}
	if reason == nil {
		reason = errors.New("no reason given")
	}
	return agree(ctx, c, timeout, invalidRecord(reason), reason)
}

// agree exchanges every rank's record (an all-gather of the lengths, then
// of the records padded to the longest) and compares them. A rank whose
// configuration is invalid (invalid, with invalidRecord as rec) takes part
// too, so that the others fail at once, and gets its own *ConfigError
// whatever the exchange gave. Each all-gather is bounded by timeout
// (DefaultTimeout when not positive).
func agree(ctx context.Context, c comm.Comm, timeout time.Duration, rec []field, invalid error) error {
	recs, err := exchangeRecords(ctx, c, timeout, encodeRecord(rec))
	switch {
	case invalid != nil:
		return &ConfigError{Rank: c.Rank(), Reason: invalid.Error(), Err: invalid}
	case err != nil:
		return err
	}
	for r, fs := range recs {
		if fs[0].value != "" {
			return &ConfigError{Rank: r, Reason: fs[0].value}
		}
	}
	return compareRecords(recs)
}

// exchangeRecords all-gathers this rank's encoded record rec and returns
// every rank's, decoded.
func exchangeRecords(ctx context.Context, c comm.Comm, timeout time.Duration, rec []byte) ([][]field, error) {
	rank, n := c.Rank(), c.Size()
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	gather := func(dst, src []byte) error {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if err := c.AllGather(ctx, dst, src); err != nil {
			return fmt.Errorf("overlap: handshake on rank %d: %w", rank, err)
		}
		return nil
	}
	lens := make([]byte, 8*n)
	if err := gather(lens, binary.LittleEndian.AppendUint64(nil, uint64(len(rec)))); err != nil {
		return nil, err
	}
	longest := 0
	for r := range n {
		longest = max(longest, int(binary.LittleEndian.Uint64(lens[8*r:])))
	}
	all := make([]byte, n*longest)
	if err := gather(all, append(rec, make([]byte, longest-len(rec))...)); err != nil {
		return nil, err
	}
	recs := make([][]field, n)
	for r := range n {
		l := int(binary.LittleEndian.Uint64(lens[8*r:]))
		fs, err := decodeRecord(all[r*longest : r*longest+l])
		if err != nil || len(fs) == 0 || fs[0].name != "invalid" {
			return nil, fmt.Errorf("overlap: handshake: rank %d sent an unreadable record (%v)", r, err)
		}
		recs[r] = fs
	}
	return recs, nil
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

// onOff names a switch's setting as the handshake and the state report it.
func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func orNone(s string) string {
	if s == "" {
		return "nothing"
	}
	return s
}

// schedule is the compression warm-up as the handshake and the state
// compare it: the phases with canonical specs, "" without a Schedule.
func schedule(e *core) string {
	if e.phases == nil {
		return e.sched
	}
	ps := make([]Phase, len(e.phases)-1)
	for i := range ps {
		ps[i] = Phase{Steps: e.cfg.Schedule[i].Steps, Spec: e.phases[i].spec}
	}
	return FormatSchedule(ps)
}

// layoutName is a StrategyHier layout as the handshake and the state
// errors name it, "flat" for the other strategies.
func layoutName(t comm.Topology) string {
	if t.Nodes == 0 {
		return "flat"
	}
	return fmt.Sprintf("%d nodes × %d ranks", t.Nodes, t.LocalSize)
}
