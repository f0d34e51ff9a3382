package compress

import (
	"fmt"
	"runtime"
	"sort"
	"strconv"
	"strings"
)

// Parse builds the compressor a spec string describes. A spec is a codec name
// followed by ':'-separated arguments: positional ones first (a ratio, the
// word "sampled"), then NAME=VALUE options. Parsing is strict: a spec is
// printable ASCII without spaces, a ratio is a plain decimal (digits and
// at most one point: no sign, exponent, hexadecimal, inf or nan) of a
// normal number in (0, 1], an integer is decimal digits without a sign or
// leading zeros (a seed may also be 0x followed by hexadecimal digits);
// anything else, an unknown name, a missing or extra argument, an unknown
// or repeated option or a value out of range is a *SpecError.
//
//	none | fp16 | bf16
//	topk:RATIO[:sampled]         RATIO in (0,1]; k = max(1, round(RATIO·n))
//	randomk:RATIO[:seed=S]       same k; indices from (S, Key)
//	int8 | int4 | int2           [:bucket=N (512)][:round=stochastic|nearest][:seed=S]
//	sign                         [:bucket=N (512)]
//
// Every codec also takes lossless=none|zstd|huff0 (default none), the
// optional entropy stage applied to the payload body (see Lossless).
//
// Options are applied after the spec: they tune execution (parallelism),
// never the payload, so ranks may differ in them.
func Parse(spec string, opts ...Option) (Compressor, error) {
	o := defaultOptions()
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	a, err := splitSpec(spec)
	if err != nil {
		return nil, err
	}
	build, ok := codecBuilders[a.name]
	if !ok {
		return nil, &SpecError{Spec: spec, Reason: fmt.Sprintf("unknown codec %q (want one of %s)", a.name, strings.Join(CodecNames(), ", "))}
	}
	c, err := build(a)
	var lossless Lossless
	if err == nil {
		lossless, err = a.lossless()
	}
	if err == nil {
		err = a.done()
	}
	if err != nil {
		return nil, &SpecError{Spec: spec, Reason: err.Error()}
	}
	cc := &compressor{spec: a.canonical(), impl: c, lossless: lossless, opts: o}
	if _, ok := c.(sparseCodec); ok {
		return sparseCompressor{cc}, nil
	}
	return cc, nil
}

// CodecNames lists the codec names Parse accepts, sorted.
func CodecNames() []string {
	names := make([]string, 0, len(codecBuilders))
	for n := range codecBuilders {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// codecBuilders maps a spec name to the constructor of its codec. Each
// constructor consumes its arguments from a; anything left over is an error.
var codecBuilders = map[string]func(a *specArgs) (codec, error){}

// registerCodec adds a codec constructor under name; called from init.
func registerCodec(name string, build func(a *specArgs) (codec, error)) {
	codecBuilders[name] = build
}

// specArgs is a parsed spec: its name, positional arguments and options, with
// the canonical form of everything consumed so far.
type specArgs struct {
	name       string
	positional []string
	options    map[string]string
	usedPos    int
	canonPos   []string
	canonOpts  []string // "name=value", only non-default values, in consumption order
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
	a.canonPos = append(a.canonPos, strconv.FormatFloat(r, 'f', -1, 64))
	return r, nil
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
		a.canonPos = append(a.canonPos, word)
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
	a.canon(name, strconv.FormatInt(v, 10), v == def)
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
	a.canon(name, strconv.FormatUint(v, 10), v == 0)
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
			a.canon(name, s, s == choices[0])
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

func (a *specArgs) canon(name, value string, isDefault bool) {
	if !isDefault {
		a.canonOpts = append(a.canonOpts, name+"="+value)
	}
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

func (a *specArgs) canonical() string {
	parts := append([]string{a.name}, a.canonPos...)
	return strings.Join(append(parts, a.canonOpts...), ":")
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
