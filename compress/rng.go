package compress

// The counter-based random numbers behind stochastic rounding and random-k.
// Draw i of a stream is a pure function of (seed, key, domain, i), so any
// backend can compute any draw in any order and get the same bits. The
// definition, which the CUDA kernels follow exactly:
//
//	mix64(z)      = SplitMix64's finalizer:
//	                z = (z ^ z>>30) · 0xbf58476d1ce4e5b9
//	                z = (z ^ z>>27) · 0x94d049bb133111eb
//	                z ^ z>>31
//	base          = mix64(seed ^ mix64(key.Bucket ^ mix64(key.Step ^ domain)))
//	draw(i)       = mix64(base + (i+1) · 0x9e3779b97f4a7c15)   (all mod 2^64)
//	uniform(i)    = float32(draw(i) >> 40) · 2^-24             in [0, 1), exact
//
// Stochastic rounding of element i uses uniform(i) of the DomainRound stream;
// random-k's stratum j uses draw(j) of the DomainRandomK stream.
const (
	DomainRound   uint64 = 0x726f756e64000001 // stochastic rounding
	DomainRandomK uint64 = 0x72616e646b000002 // random-k index choice
)

const golden = 0x9e3779b97f4a7c15

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

// Draw returns draw i of the stream: 64 uniformly distributed bits.
func (s RandomStream) Draw(i uint64) uint64 { return mix64(s.base + (i+1)*golden) }

// Uniform returns draw i as a float32 in [0, 1) with 24 random bits.
func (s RandomStream) Uniform(i uint64) float32 {
	return float32(s.Draw(i)>>40) * (1.0 / (1 << 24))
}
