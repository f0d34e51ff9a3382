package overlap

import (
	"fmt"

	"github.com/gradcomp/gradcomp/compress"
)

// Ramp returns a compression warm-up (a Config.Schedule) that leads to
// spec in phases of phaseSteps steps each, every phase keeping spec's
// other settings (bucket, rounding, seed):
//
//   - top-k and random-k: ratios 1/4, 1/16, 1/64, … while above spec's
//     (DGC's 75 %, 93.75 %, 98.4 %, 99.6 % sparsity, Lin et al. 2018);
//   - int2: int8, then int4; int4: int8; sign: int8, int4, int2 (one
//     strategy, quantized SRA or all-gather, for all of them);
//   - int8, fp16, bf16 and none: no phases (nil).
//
// Ramp("topk:0.01", 10) is 10@topk:0.25,10@topk:0.0625,10@topk:0.015625.
func Ramp(spec string, phaseSteps int) ([]Phase, error) {
	s, err := compress.ParseSpec(spec)
	if err != nil {
		return nil, err
	}
	if phaseSteps < 1 {
		return nil, fmt.Errorf("overlap: Ramp(%s): %d steps per phase, want at least 1", spec, phaseSteps)
	}
	var milder []compress.Spec
	switch s.Codec {
	case compress.CodecTopK, compress.CodecRandomK:
		for r := 0.25; r > s.Ratio; r /= 4 {
			p := s
			p.Ratio = r
			milder = append(milder, p)
		}
	case compress.CodecInt2, compress.CodecInt4, compress.CodecSign:
		for _, c := range []compress.Codec{compress.CodecInt8, compress.CodecInt4, compress.CodecInt2} {
			if c == s.Codec {
				break
			}
			p := compress.Spec{Codec: c, Bucket: s.Bucket, Nearest: s.Nearest, Seed: s.Seed}
			milder = append(milder, p)
		}
	}
	var phases []Phase
	for _, p := range milder {
		phases = append(phases, Phase{Steps: phaseSteps, Spec: p.String()})
	}
	return phases, nil
}
