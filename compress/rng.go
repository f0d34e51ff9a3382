package compress

// The counter-based random numbers behind stochastic rounding and random-k.
// Draw i of a stream is a pure function of (seed, key, domain, i), so any
// backend can compute any draw in any order and get the same bits. The
// definition, which the CUDA kernels follow exactly (all arithmetic
// modulo 2^64, resp. 2^32 on uint32 values):
//
//	mix64(z)      = SplitMix64's finalizer:
//	                z = (z ^ z>>30) · 0xbf58476d1ce4e5b9
//	                z = (z ^ z>>27) · 0x94d049bb133111eb
//	                z ^ z>>31
//	base          = mix64(seed ^ mix64(key.Bucket ^ mix64(key.Step ^ domain)))
//	draw(i)       = mix64(base + (i+1) · 0x9e3779b97f4a7c15)          64-bit
//
//	k0, k1        = uint32(base), uint32(base >> 32)
//	draw32(i)     = x = uint32(i) · 0x9e3779b9 + k0                    i < 2^32
//	                x = (x ^ x>>16) · 0x7feb352d
//	                x = (x ^ x>>15 ^ k1) · 0x846ca68b
//	                x ^ x>>16
//	uniform(i)    = float32(draw32(i) >> 8) · 2^-24                    in [0, 1), exact
//
// draw32 is Wellons' lowbias32 integer hash (two 32-bit multiplies, the
// lowest avalanche bias of its shape found by hash-prospector) of a Weyl
// sequence keyed by k0, with k1 xored between its rounds so that two
// streams are not shifts of each other. The Weyl step matters: lowbias32
// of consecutive integers fails the chi-square below (up to 120 standard
// deviations over 2^24 draws), of the Weyl sequence it passes. Its lanes are 32 bits wide, which
// AVX2, NEON and a GPU multiply natively (SplitMix64's 64-bit products are
// several instructions on each). Stochastic rounding of element i uses
// uniform(i) of the DomainRound stream; random-k's stratum j uses draw(j)
// of the DomainRandomK stream (k draws per bucket, off the hot path, so it
// keeps the 64-bit draws and their 32 high bits for the index).
//
// Tests of draw32's quality (rng_test.go, TestUniformQuality): a
// chi-square of the top 16 bits over 2^16 bins of 2^24 consecutive draws
// of 4 streams; of the top 12 bits of 64 indices across 2^16 consecutive
// steps, and buckets (streams of neighbouring keys); of the pairs (draw i,
// draw i+1) over 2^12 bins; the avalanche of single-bit flips of hash32's
// input; and TestQuantUnbiased, the mean of decoded − input over 1500 keys
// per element, within the bound stated there.
const (
	DomainRound   uint64 = 0x726f756e64000001 // stochastic rounding
	DomainRandomK uint64 = 0x72616e646b000002 // random-k index choice
	// DomainLowRank plus a tensor's index in its bucket is the domain of
	// PowerSGD's Q draws: uniform(i) of that stream, scaled to [−1, 1),
	// is element i of the tensor's Q (cols×R, row-major).
	DomainLowRank uint64 = 0x504f574500000000
)

// RandomStreamVersion names the definition above. Ranks that exchange
// stochastically rounded payloads must agree on it (the overlap engine's
// handshake compares it): version 1 drew stochastic rounding from the
// 64-bit draw(i).
const RandomStreamVersion = "2 (lowbias32 lanes)"

const golden = 0x9e3779b97f4a7c15

// The multipliers of draw32: the Weyl step, then lowbias32's two.
const (
	lane32Weyl = 0x9e3779b9
	lane32M1   = 0x7feb352d
	lane32M2   = 0x846ca68b
)

func mix64(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// RandomStream is one counter-based random stream (see the definition above).
type RandomStream struct{ base uint64 }

// NewRandomStream returns the stream for (seed, key, domain).
func NewRandomStream(seed uint64, key Key, domain uint64) RandomStream {
	return RandomStream{base: mix64(seed ^ mix64(key.Bucket^mix64(key.Step^domain)))}
}

// Draw returns the 64-bit draw i of the stream: 64 uniformly distributed bits.
func (s RandomStream) Draw(i uint64) uint64 { return mix64(s.base + (i+1)*golden) }

// Draw32 returns the 32-bit draw32(i) of the stream.
func (s RandomStream) Draw32(i uint32) uint32 {
	return lanes32(s.base).draw(i)
}

// Uniform returns uniform(i): draw32(i) as a float32 in [0, 1) with 24
// random bits.
func (s RandomStream) Uniform(i uint32) float32 {
	k := lanes32(s.base)
	return uniform32(k.counter(i), k.k1)
}

// laneKeys holds the keys k0, k1 of draw32.
type laneKeys struct{ k0, k1 uint32 }

// lanes32 returns the keys of draw32 for a stream's base.
func lanes32(base uint64) laneKeys { return laneKeys{uint32(base), uint32(base >> 32)} }

// draw returns draw32(i).
func (k laneKeys) draw(i uint32) uint32 { return hash32(k.counter(i), k.k1) }

// counter returns draw32's x for index i: i·0x9e3779b9 + k0.
func (k laneKeys) counter(i uint32) uint32 { return i*lane32Weyl + k.k0 }

// uniform32 returns float32(hash32(x, k1) >> 8) · 2^-24: uniform(i) from
// draw32's x on.
func uniform32(x, k1 uint32) float32 { return float32(hash32(x, k1)>>8) * 0x1p-24 }

// hash32 is draw32 from x on.
func hash32(x, k1 uint32) uint32 {
	x = (x ^ x>>16) * lane32M1
	x = (x ^ x>>15 ^ k1) * lane32M2
	return x ^ x>>16
}
