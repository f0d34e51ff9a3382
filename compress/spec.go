package compress

import (
	"fmt"
	"runtime"
	"sort"
	"strconv"
	"strings"
)

// Spec is a compressor's configuration: what a spec string says, typed
// and validated. ParseSpec reads one from a string, String prints it
// canonically (ParseSpec(s.String()) returns s), New builds the
// compressor. Fields a codec does not use are zero, and so are the
// defaults: a Spec has one value per configuration, so == compares two.
type Spec struct {
	Codec Codec
	// Ratio is the fraction of elements top-k and random-k keep, in (0, 1]:
	// k = max(1, round(Ratio·n)).
	Ratio float64
	// Sampled makes top-k select by a threshold estimated from a sample
	// instead of exactly.
	Sampled bool
	// Chunk makes top-k select within each chunk of Chunk consecutive
	// elements on its own, in [MinTopKChunk, MaxTopKChunk]; 0 selects over
	// the whole input (see chunkTopK).
	Chunk int
	// Bits is the width of the values chunked top-k keeps: 2, 4 or 8
	// (sign and magnitude, the magnitude quantized per chunk); 0 keeps
	// them as float32.
	Bits int
	// Bucket is the elements per scale of int8, int4, int2 and sign; 0 is
	// the default, 512.
	Bucket int
	// Nearest makes int8, int4, int2 and top-k's Bits round to nearest
	// instead of stochastically.
	Nearest bool
	// Seed seeds random-k's indices, the stochastic rounding of the
	// quantizers and of top-k's Bits, and PowerSGD's initial Q.
	Seed uint64
	// Rank is PowerSGD's R, the rank of each matrix's approximation (≥ 1;
	// clamped per matrix to its smaller side).
	Rank int
	// Cold turns PowerSGD's warm start off: Q is drawn anew every step
	// instead of starting from the previous step's averaged Q.
	Cold bool
	// MinCompression is the factor PowerSGD must save on a tensor for it
	// to be compressed (rows·cols ≥ MinCompression·(rows+cols)·R); the
	// others are exchanged uncompressed. 0 is the default, 2.
	MinCompression float64
	// Lossless is the entropy stage applied to the payload body.
	Lossless Lossless
}

// The fields of a Spec, as a set: which ones a codec uses.
type specFields uint16

const (
	fieldRatio specFields = 1 << iota
	fieldSampled
	fieldChunk
	fieldBits
	fieldBucket
	fieldNearest
	fieldSeed
	fieldRank
	fieldCold
	fieldMinCompression
)

// codecDef is how one codec reads its arguments and is built.
type codecDef struct {
	uses specFields
	// parse reads the codec's arguments from a into s; nil for none.
	parse func(a *specArgs, s *Spec) error
	// build makes the codec of a valid s; nil for a codec that is only
	// an exchange of the engine (engineOnly says why).
	build func(s Spec) codec
	// engineOnly is why New refuses the codec: it has no payload of its
	// own, only an exchange (overlap's), e.g. PowerSGD's two all-reduces.
	engineOnly string
	// check reports why the fields a codec uses do not go together (a
	// reason, which Validate and ParseSpec wrap in a *SpecError), or nil;
	// nil for a codec without such rules.
	check func(s Spec) error
}

// codecDefs holds every codec's definition, registered from init.
var codecDefs = map[Codec]codecDef{}

// registerCodec adds the definition of codec id; called from init.
func registerCodec(id Codec, d codecDef) { codecDefs[id] = d }

// codecByName maps a spec name to its codec.
func codecByName(name string) (Codec, bool) {
	for c, n := range codecNames {
		if n == name {
			_, ok := codecDefs[c]
			return c, ok
		}
	}
	return 0, false
}

// CodecNames lists the codec names Parse accepts, sorted.
func CodecNames() []string {
	names := make([]string, 0, len(codecDefs))
	for c := range codecDefs {
		names = append(names, c.String())
	}
	sort.Strings(names)
	return names
}

// ParseSpec reads a spec string. A spec is a codec name followed by
// ':'-separated arguments: positional ones first (a ratio, the word
// "sampled"), then NAME=VALUE options. Parsing is strict: a spec is
// printable ASCII without spaces, a ratio is a plain decimal (digits and
// at most one point: no sign, exponent, hexadecimal, inf or nan) of a
// normal number in (0, 1], an integer is decimal digits without a sign or
// leading zeros (a seed may also be 0x followed by hexadecimal digits);
// anything else, an unknown name, a missing or extra argument, an unknown
// or repeated option or a value out of range is a *SpecError.
//
//	none | fp16 | bf16
//	topk:RATIO[:sampled]         RATIO in (0,1]; k = max(1, round(RATIO·n))
//	topk:RATIO:chunk=C           k = max(1, round(RATIO·c)) per chunk of c ≤ C
//	  [:bits=32|2|4|8]           elements, C in [64, 65536]; bits: the kept
//	  [:round=stochastic|nearest] values' width (32: float32, the default),
//	  [:seed=S]                  round and seed only with bits 2, 4 or 8
//	randomk:RATIO[:seed=S]       same k; indices from (S, Key)
//	int8 | int4 | int2           [:bucket=N (512)][:round=stochastic|nearest][:seed=S]
//	sign                         [:bucket=N (512)]
//	powersgd:R                   [:warm=on|off][:min_compression=F (2)][:seed=S]
//	                             R an integer in [1, 1024]; F a plain decimal ≥ 1
//
// Every codec also takes lossless=none|zstd|huff0 (default none), the
// optional entropy stage applied to the payload body (see Lossless).
func ParseSpec(spec string) (Spec, error) {
	a, err := splitSpec(spec)
	if err != nil {
		return Spec{}, err
	}
	id, ok := codecByName(a.name)
	if !ok {
		return Spec{}, &SpecError{Spec: spec, Reason: fmt.Sprintf("unknown codec %q (want one of %s)", a.name, strings.Join(CodecNames(), ", "))}
	}
	s := Spec{Codec: id}
	if d := codecDefs[id]; d.parse != nil {
		err = d.parse(a, &s)
		if err == nil && d.check != nil {
			err = d.check(s)
		}
	}
	if err == nil {
		s.Lossless, err = a.lossless()
	}
	if err == nil {
		err = a.done()
	}
	if err != nil {
		return Spec{}, &SpecError{Spec: spec, Reason: err.Error()}
	}
	return s, nil
}

// String returns the canonical spec string: the codec's name, then the
// arguments that differ from their defaults, ratios in plain decimal.
func (s Spec) String() string {
	parts := []string{s.Codec.String()}
	if s.Ratio != 0 {
		parts = append(parts, strconv.FormatFloat(s.Ratio, 'f', -1, 64))
	}
	if s.Sampled {
		parts = append(parts, "sampled")
	}
	if s.Rank != 0 {
		parts = append(parts, strconv.Itoa(s.Rank))
	}
	if s.Bucket != 0 {
		parts = append(parts, "bucket="+strconv.Itoa(s.Bucket))
	}
	if s.Chunk != 0 {
		parts = append(parts, "chunk="+strconv.Itoa(s.Chunk))
	}
	if s.Bits != 0 {
		parts = append(parts, "bits="+strconv.Itoa(s.Bits))
	}
	if s.Nearest {
		parts = append(parts, "round=nearest")
	}
	if s.Cold {
		parts = append(parts, "warm=off")
	}
	if s.MinCompression != 0 {
		parts = append(parts, "min_compression="+strconv.FormatFloat(s.MinCompression, 'f', -1, 64))
	}
	if s.Seed != 0 {
		parts = append(parts, "seed="+strconv.FormatUint(s.Seed, 10))
	}
	if s.Lossless != LosslessNone {
		parts = append(parts, "lossless="+s.Lossless.String())
	}
	return strings.Join(parts, ":")
}

// BucketLen returns the elements per scale of a bucketed codec: Bucket,
// or 512 when it is 0.
func (s Spec) BucketLen() int {
	if s.Bucket == 0 {
		return defaultQuantBucket
	}
	return s.Bucket
}

// Validate reports why s is not a configuration New accepts (a
// *SpecError), or nil: an unknown codec or lossless stage, a field the
// codec does not use that is not zero, a ratio that is not a normal
// number in (0, 1], a bucket outside [0, 16777216], or top-k options that
// do not go together (a chunk outside [MinTopKChunk, MaxTopKChunk], bits
// other than 2, 4 or 8, bits without a chunk, sampled with a chunk,
// round=nearest or a seed without bits).
func (s Spec) Validate() error {
	d, ok := codecDefs[s.Codec]
	if !ok {
		return &SpecError{Spec: s.String(), Reason: fmt.Sprintf("unknown codec %v (want one of %s)", s.Codec, strings.Join(CodecNames(), ", "))}
	}
	bad := func(format string, args ...any) error {
		return &SpecError{Spec: s.String(), Reason: fmt.Sprintf(format, args...)}
	}
	for _, f := range []struct {
		field specFields
		name  string
		set   bool
	}{
		{fieldRatio, "Ratio", s.Ratio != 0}, {fieldSampled, "Sampled", s.Sampled}, {fieldBucket, "Bucket", s.Bucket != 0},
		{fieldChunk, "Chunk", s.Chunk != 0}, {fieldBits, "Bits", s.Bits != 0},
		{fieldNearest, "Nearest", s.Nearest}, {fieldSeed, "Seed", s.Seed != 0},
		{fieldRank, "Rank", s.Rank != 0}, {fieldCold, "Cold", s.Cold}, {fieldMinCompression, "MinCompression", s.MinCompression != 0},
	} {
		if f.set && d.uses&f.field == 0 {
			return bad("%s does not apply to %v", f.name, s.Codec)
		}
	}
	switch {
	case d.uses&fieldRatio != 0 && !(s.Ratio >= smallestNormal && s.Ratio <= 1):
		return bad("ratio %v is not a normal number in (0,1]", s.Ratio)
	case d.uses&fieldRank != 0 && (s.Rank < 1 || s.Rank > MaxLowRank):
		return bad("rank %d is not in [1, %d]", s.Rank, MaxLowRank)
	case s.MinCompression != 0 && !(s.MinCompression >= 1 && s.MinCompression <= maxMinCompression):
		return bad("min_compression %v is not in [1, %v] (or 0, the default 2)", s.MinCompression, float64(maxMinCompression))
	case s.Bucket < 0 || s.Bucket > maxQuantBucket:
		return bad("bucket %d is not in [1, %d] (or 0, the default)", s.Bucket, maxQuantBucket)
	case s.Lossless > LosslessHuff0:
		return bad("unknown lossless stage %v", s.Lossless)
	}
	if d.check != nil {
		if err := d.check(s); err != nil {
			return bad("%v", err)
		}
	}
	return nil
}

// Parse builds the compressor a spec string describes (ParseSpec, then
// New). Options are applied after the spec: they tune execution
// (parallelism), never the payload, so ranks may differ in them.
func Parse(spec string, opts ...Option) (Compressor, error) {
	s, err := ParseSpec(spec)
	if err != nil {
		return nil, err
	}
	return New(s, opts...)
}

// New builds the compressor of s (a *SpecError if s does not Validate),
// with execution options opts.
func New(s Spec, opts ...Option) (Compressor, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	o := defaultOptions()
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	if why := codecDefs[s.Codec].engineOnly; why != "" {
		return nil, &SpecError{Spec: s.String(), Reason: why}
	}
	if s.Bucket == defaultQuantBucket {
		s.Bucket = 0 // one value per configuration
	}
	c := codecDefs[s.Codec].build(s)
	cc := &compressor{spec: s, name: s.String(), impl: c, lossless: s.Lossless, opts: o}
	if _, ok := c.(sparseCodec); ok {
		return sparseCompressor{cc}, nil
	}
	if _, ok := cc.impl.(feedbackCodec); ok {
		return feedbackCompressor{cc}, nil
	}
	return cc, nil
}

// specArgs is a split spec string: its name, positional arguments and
// options, and which of them the codec's parser consumed.
type specArgs struct {
	name       string
	positional []string
	options    map[string]string
	usedPos    int
	consumed   map[string]bool
}

func splitSpec(spec string) (*specArgs, error) {
	for i := range len(spec) {
		if c := spec[i]; c <= ' ' || c > '~' {
			return nil, &SpecError{Spec: spec, Reason: fmt.Sprintf("byte %d is 0x%02x: a spec is printable ASCII without spaces", i, c)}
		}
	}
	parts := strings.Split(spec, ":")
	a := &specArgs{name: parts[0], options: map[string]string{}, consumed: map[string]bool{}}
	if a.name == "" {
		return nil, &SpecError{Spec: spec, Reason: "empty codec name"}
	}
	for i, p := range parts[1:] {
		if p == "" {
			return nil, &SpecError{Spec: spec, Reason: fmt.Sprintf("empty argument %d", i+1)}
		}
		name, value, isOpt := strings.Cut(p, "=")
		if isOpt && (name == "" || value == "") {
			return nil, &SpecError{Spec: spec, Reason: fmt.Sprintf("argument %d (%q) is not NAME=VALUE", i+1, p)}
		}
		if !isOpt {
			if len(a.options) > 0 {
				return nil, &SpecError{Spec: spec, Reason: fmt.Sprintf("positional argument %q after an option", p)}
			}
			a.positional = append(a.positional, p)
			continue
		}
		if _, dup := a.options[name]; dup {
			return nil, &SpecError{Spec: spec, Reason: fmt.Sprintf("option %q given twice", name)}
		}
		a.options[name] = value
	}
	return a, nil
}

// ratio consumes the next positional argument as a ratio in (0, 1].
func (a *specArgs) ratio() (float64, error) {
	if a.usedPos >= len(a.positional) {
		return 0, fmt.Errorf("%s needs a ratio in (0,1], as in %s:0.01", a.name, a.name)
	}
	s := a.positional[a.usedPos]
	r, err := strconv.ParseFloat(s, 64)
	if !isDecimal(s) || err != nil || r < smallestNormal || r > 1 {
		return 0, fmt.Errorf("ratio %q is not a plain decimal in (0,1]", s)
	}
	a.usedPos++
	return r, nil
}

// count consumes the next positional argument as an integer in [lo, hi]
// (what says what it is).
func (a *specArgs) count(what string, lo, hi int) (int, error) {
	if a.usedPos >= len(a.positional) {
		return 0, fmt.Errorf("%s needs %s in [%d, %d], as in %s:%d", a.name, what, lo, hi, a.name, lo+1)
	}
	s := a.positional[a.usedPos]
	v, err := strconv.Atoi(s)
	if !isInteger(s) || err != nil || v < lo || v > hi {
		return 0, fmt.Errorf("%s %q is not an integer in [%d, %d]", what, s, lo, hi)
	}
	a.usedPos++
	return v, nil
}

// decimalOption consumes option name as a plain decimal in [lo, hi],
// default 0 (absent).
func (a *specArgs) decimalOption(name string, lo, hi float64) (float64, error) {
	s, ok := a.take(name)
	if !ok {
		return 0, nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if !isDecimal(s) || err != nil || v < lo || v > hi {
		return 0, fmt.Errorf("option %s=%q is not a plain decimal in [%v, %v]", name, s, lo, hi)
	}
	return v, nil
}

// smallestNormal is the least normal float64, 2⁻¹⁰²²: a ratio below it
// (a subnormal, or a decimal that rounds to zero) is refused.
const smallestNormal = 0x1p-1022

// isDecimal reports whether s is digits with at most one decimal point
// and at least one digit.
func isDecimal(s string) bool {
	digits, point := 0, false
	for i := range len(s) {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			digits++
		case c == '.' && !point:
			point = true
		default:
			return false
		}
	}
	return digits > 0
}

// isInteger reports whether s is decimal digits without a leading zero
// (other than "0" itself).
func isInteger(s string) bool {
	if s == "" || s[0] == '0' && len(s) > 1 {
		return false
	}
	return strings.Trim(s, "0123456789") == ""
}

// flag consumes the next positional argument if it equals word.
func (a *specArgs) flag(word string) bool {
	if a.usedPos < len(a.positional) && a.positional[a.usedPos] == word {
		a.usedPos++
		return true
	}
	return false
}

// intOption consumes option name as an integer in [lo, hi], default def.
func (a *specArgs) intOption(name string, def, lo, hi int64) (int64, error) {
	s, ok := a.take(name)
	if !ok {
		return def, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if !isInteger(s) || err != nil || v < lo || v > hi {
		return 0, fmt.Errorf("option %s=%q is not an integer in [%d, %d]", name, s, lo, hi)
	}
	return v, nil
}

// uintOption consumes option name as an unsigned 64-bit integer, default 0.
func (a *specArgs) uintOption(name string) (uint64, error) {
	s, ok := a.take(name)
	if !ok {
		return 0, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if hex, ok := strings.CutPrefix(s, "0x"); ok && hex != "" && strings.Trim(hex, "0123456789abcdefABCDEF") == "" {
		v, err = strconv.ParseUint(hex, 16, 64)
	} else if !isInteger(s) {
		err = strconv.ErrSyntax
	}
	if err != nil {
		return 0, fmt.Errorf("option %s=%q is not an unsigned 64-bit integer (decimal, or 0x and hexadecimal)", name, s)
	}
	return v, nil
}

// enumOption consumes option name as one of choices; choices[0] is the default.
func (a *specArgs) enumOption(name string, choices ...string) (string, error) {
	s, ok := a.take(name)
	if !ok {
		return choices[0], nil
	}
	for _, c := range choices {
		if s == c {
			return s, nil
		}
	}
	return "", fmt.Errorf("option %s=%q is not one of %s", name, s, strings.Join(choices, "|"))
}

func (a *specArgs) take(name string) (string, bool) {
	s, ok := a.options[name]
	if ok {
		a.consumed[name] = true
	}
	return s, ok
}

// lossless consumes the lossless option, common to every codec.
func (a *specArgs) lossless() (Lossless, error) {
	s, err := a.enumOption("lossless", "none", "zstd", "huff0")
	if err != nil {
		return 0, err
	}
	return losslessByName[s], nil
}

// done reports arguments no constructor consumed.
func (a *specArgs) done() error {
	if a.usedPos < len(a.positional) {
		return fmt.Errorf("unexpected argument %q for %s", a.positional[a.usedPos], a.name)
	}
	for name := range a.options {
		if !a.consumed[name] {
			return fmt.Errorf("unknown option %q for %s", name, a.name)
		}
	}
	return nil
}

// Option tunes how a compressor runs (not what it writes).
type Option func(*options) error

type options struct {
	workers     int // goroutines for one call
	minParallel int // elements below which a call stays on one goroutine
}

func defaultOptions() options {
	return options{workers: runtime.GOMAXPROCS(0), minParallel: 1 << 18}
}

// WithWorkers sets how many goroutines one Compress or Decompress call may
// use (default GOMAXPROCS). 1 keeps every call on the caller's goroutine.
func WithWorkers(n int) Option {
	return func(o *options) error {
		if n < 1 {
			return fmt.Errorf("compress: WithWorkers(%d): need at least 1 worker", n)
		}
		o.workers = n
		return nil
	}
}

// WithMinParallel sets the element count below which a call runs on one
// goroutine however many workers are allowed (default 262144, 1 MiB of fp32).
func WithMinParallel(n int) Option {
	return func(o *options) error {
		if n < 1 {
			return fmt.Errorf("compress: WithMinParallel(%d): need a positive element count", n)
		}
		o.minParallel = n
		return nil
	}
}
