package overlap

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/internal/record"
)

// protocolVersion names the engine's exchange protocol (slot format,
// statuses, keys, strategies). Ranks must agree on it. 2: the slot head
// both backends send (parts.go), where 1 had a 12-byte status on the host.
const protocolVersion = 2

// field is one entry of a rank's handshake record.
type field = record.Field

// handshakeRecord lists what every rank must agree on, in the order a
// mismatch is reported. Its first field, "invalid", is empty: a rank whose
// configuration is invalid sends invalidRecord instead.
func handshakeRecord(e *core, sizes []int) []field {
	f := []field{
		{Name: "invalid", Value: ""},
		{Name: "protocol version", Value: strconv.Itoa(protocolVersion)},
		{Name: "random stream", Value: compress.RandomStreamVersion}, // stochastic rounding's draws
		{Name: "spec", Value: e.spec},
		{Name: "strategy", Value: e.strategy.String()},
		{Name: "layout", Value: layoutName(e.layout)},
		{Name: "shape", Value: shapeName(e.trials)},
		{Name: "node spec", Value: nodeSpecName(e.cfg.NodeSpec)},
		{Name: "error feedback", Value: onOff(e.cfg.ErrorFeedback)},
		{Name: "decision", Value: e.cfg.Decision.String()},
		{Name: "fail on non-finite", Value: onOff(e.cfg.FailOnNonFinite)},
		{Name: "warm-up steps", Value: strconv.Itoa(e.cfg.Warmup)},
		{Name: "momentum", Value: strconv.FormatFloat(e.cfg.Momentum, 'g', -1, 64)},
		{Name: "momentum masking", Value: onOff(e.cfg.MomentumMasking)},
		{Name: "schedule", Value: cmp.Or(schedule(e), "none")},
		{Name: "accuracy guard", Value: strconv.FormatFloat(e.cfg.Guard, 'g', -1, 64)},
		{Name: "feedback decay", Value: formatFloat(e.cfg.decay())}, // β, 1 for none (FeedbackDecay 0)
		{Name: "buckets", Value: strconv.Itoa(len(sizes))},
	}
	for i, n := range sizes {
		f = append(f, field{Name: fmt.Sprintf("bucket %d elements", i), Value: strconv.Itoa(n)})
		f = append(f, field{Name: fmt.Sprintf("bucket %d shapes", i), Value: shapesName(e.cfg.Shapes, i)})
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
func invalidRecord(reason error) []field { return []field{{Name: "invalid", Value: reason.Error()}} }

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
	recs, err := exchangeRecords(ctx, c, timeout, rec)
	switch {
	case invalid != nil:
		return &ConfigError{Rank: c.Rank(), Reason: invalid.Error(), Err: invalid}
	case err != nil:
		return err
	}
	for r, fs := range recs {
		if fs[0].Value != "" {
			return &ConfigError{Rank: r, Reason: fs[0].Value}
		}
	}
	return compareRecords(recs)
}

// exchangeRecords all-gathers this rank's record rec and returns every
// rank's, each a record that starts with its "invalid" field.
func exchangeRecords(ctx context.Context, c comm.Comm, timeout time.Duration, rec []field) ([][]field, error) {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	recs, err := record.Gather(ctx, c, timeout, "overlap: handshake", rec)
	if err != nil {
		return nil, err
	}
	for r, fs := range recs {
		if len(fs) == 0 || fs[0].Name != "invalid" {
			return nil, fmt.Errorf("overlap: handshake: rank %d sent an unreadable record (no invalid field first)", r)
		}
	}
	return recs, nil
}

// compareRecords returns the first field, in record order, on which the
// lowest rank that differs from rank 0 differs.
func compareRecords(recs [][]field) error {
	for r, fs := range recs[1:] {
		if mine, theirs, differ := record.FirstDifference(fs, recs[0]); differ {
			return &ConfigMismatchError{Field: cmp.Or(theirs.Name, mine.Name), Rank: r + 1, Value: orNone(mine.Value), OtherRank: 0, OtherValue: orNone(theirs.Value)}
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
