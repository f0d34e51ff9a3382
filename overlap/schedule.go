package overlap

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/gradcomp/gradcomp/compress"
)

// Phase is one stage of a Config.Schedule: Steps steps compressed with
// Spec.
type Phase struct {
	Steps int
	Spec  string
}

// ParseSchedule reads a schedule written STEPS@SPEC[,STEPS@SPEC...], e.g.
// "100@topk:0.25,100@topk:0.0625"; "" is no schedule.
func ParseSchedule(s string) ([]Phase, error) {
	if s == "" {
		return nil, nil
	}
	var out []Phase
	for i, item := range strings.Split(s, ",") {
		steps, spec, ok := strings.Cut(item, "@")
		n, err := strconv.Atoi(steps)
		if !ok || err != nil || n < 1 || spec == "" {
			return nil, fmt.Errorf("overlap: schedule %q: phase %d (%q) is not STEPS@SPEC with STEPS ≥ 1", s, i, item)
		}
		out = append(out, Phase{Steps: n, Spec: spec})
	}
	return out, nil
}

// FormatSchedule writes phases as ParseSchedule reads them.
func FormatSchedule(phases []Phase) string {
	parts := make([]string, len(phases))
	for i, p := range phases {
		parts[i] = strconv.Itoa(p.Steps) + "@" + p.Spec
	}
	return strings.Join(parts, ",")
}

// phase is a schedule phase as the core runs it: steps numbered below end
// use comp, whose memories' compressors are mem1 and mem2.
type phase struct {
	end        uint64
	spec       string // canonical
	comp       compress.Compressor
	mem1, mem2 compress.Compressor
}

// configurePhases builds the Schedule's phases, then target's: each a
// compressor of the target's strategy, no lossless stage.
func (c *core) configurePhases(target compress.Compressor, strategyFor func(Strategy, compress.Codec, int) (Strategy, error)) error {
	if len(c.cfg.Schedule) == 0 {
		return nil
	}
	end := uint64(c.cfg.Warmup)
	for i, p := range c.cfg.Schedule {
		comp, err := compress.Parse(p.Spec, compress.WithWorkers(c.cfg.Workers))
		if err != nil {
			return fmt.Errorf("schedule phase %d: %w", i, err)
		}
		st, err := strategyFor(c.cfg.Strategy, comp.Codec(), c.size)
		switch {
		case err != nil:
			return fmt.Errorf("schedule phase %d (%s): %w", i, comp.Spec(), err)
		case comp.Codec() == compress.CodecNone || comp.Spec().Lossless != compress.LosslessNone:
			return fmt.Errorf("schedule phase %d (%s): a phase compresses, without a lossless stage", i, comp.Spec())
		case st != c.strategy:
			return fmt.Errorf("schedule phase %d (%s) takes strategy %v, Spec %s takes %v: a schedule keeps one strategy", i, comp.Spec(), st, target.Spec(), c.strategy)
		}
		if err := checkMasking(c.cfg, comp.Spec()); err != nil {
			return fmt.Errorf("schedule phase %d: %w", i, err)
		}
		end += uint64(p.Steps)
		mem1, mem2 := c.memories(comp)
		c.phases = append(c.phases, phase{end: end, spec: comp.Spec().String(), comp: comp, mem1: mem1, mem2: mem2})
	}
	mem1, mem2 := c.memories(target)
	c.phases = append(c.phases, phase{end: math.MaxUint64, spec: target.Spec().String(), comp: target, mem1: mem1, mem2: mem2})
	for i := range len(c.phases) - 1 {
		a, b := c.phases[i].comp.Spec(), c.phases[i+1].comp.Spec()
		fa, la := strength(a)
		fb, lb := strength(b)
		switch {
		case fa != fb:
			return fmt.Errorf("schedule phase %d (%s) and the next (%s) are of different kinds of codec: a warm-up leads to Spec %s by milder settings of its kind", i, a, b, target.Spec())
		case la > lb:
			return fmt.Errorf("schedule phase %d (%s) compresses more than the next (%s): a warm-up leads from milder settings to Spec %s", i, a, b, target.Spec())
		}
	}
	return nil
}

// strength places a compressing spec on the scale a warm-up climbs: its
// kind (top-k, random-k, the quantizers with sign, fp16/bf16) and, within
// the kind, how much it compresses (the inverse ratio, or 32 over the
// bits per element).
func strength(s compress.Spec) (kind compress.Codec, level float64) {
	switch s.Codec {
	case compress.CodecTopK, compress.CodecRandomK:
		return s.Codec, 1 / s.Ratio
	case compress.CodecInt8:
		return compress.CodecInt8, 4
	case compress.CodecInt4:
		return compress.CodecInt8, 8
	case compress.CodecInt2:
		return compress.CodecInt8, 16
	case compress.CodecSign:
		return compress.CodecInt8, 32
	}
	return compress.CodecFP16, 2 // fp16, bf16
}

// activate makes phase p the one comp, mem1 and mem2 are of, and moves
// the backend to it.
func (c *core) activate(p int) {
	ph := c.phases[p]
	c.comp, c.mem1, c.mem2, c.active = ph.comp, ph.mem1, ph.mem2, p
	c.be.usePhase()
}

// phaseAt returns the phase of step num (warm-up steps: the first).
func (c *core) phaseAt(num uint64) int {
	for i, p := range c.phases {
		if num < p.end {
			return i
		}
	}
	return len(c.phases) - 1
}
