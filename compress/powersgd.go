package compress

// PowerSGD (Vogels, Karimireddy and Jaggi, NeurIPS 2019) approximates each
// gradient matrix M by P·Qᵀ of rank R with one step of power iteration per
// training step, both factors all-reduced: P = M·Q, all-reduced and
// orthogonalized; Q = Mᵀ·P, all-reduced; M ≈ P·Qᵀ. Its exchange needs
// work between its two all-reduces, so it is not a payload codec: the spec
// is parsed here, with every other codec's, and New refuses it; the
// exchange is overlap's StrategyLowRank, and its kernels are package
// compress/lowrank.

// MaxLowRank is the largest PowerSGD rank a spec may ask for.
const MaxLowRank = 1024

// DefaultMinCompression is Spec.MinCompression's default: PowerSGD
// compresses a tensor only where it saves at least this factor.
const DefaultMinCompression = 2

// maxMinCompression bounds Spec.MinCompression.
const maxMinCompression = 1 << 20

func init() {
	registerCodec(CodecPowerSGD, codecDef{
		uses: fieldRank | fieldCold | fieldMinCompression | fieldSeed,
		parse: func(a *specArgs, s *Spec) (err error) {
			if s.Rank, err = a.count("a rank", 1, MaxLowRank); err != nil {
				return err
			}
			warm, err := a.enumOption("warm", "on", "off")
			if err != nil {
				return err
			}
			s.Cold = warm == "off"
			if s.MinCompression, err = a.decimalOption("min_compression", 1, maxMinCompression); err != nil {
				return err
			}
			if s.MinCompression == DefaultMinCompression {
				s.MinCompression = 0 // one value per configuration
			}
			s.Seed, err = a.uintOption("seed")
			return err
		},
		engineOnly: "powersgd has no payload of its own: its two all-reduces per bucket, with work between them, " +
			"are the engine's strategy low-rank (package overlap, or a gradcomp engine through the C ABI or PyTorch)",
	})
}

// MinCompressionFactor returns s.MinCompression, or its default when 0.
func (s Spec) MinCompressionFactor() float64 {
	if s.MinCompression == 0 {
		return DefaultMinCompression
	}
	return s.MinCompression
}
