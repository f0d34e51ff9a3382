package compress

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"sort"
	"sync"
)

// ErrorFeedback adds error-feedback memory to a Compressor. For each gradient
// bucket (Key.Bucket) it keeps the residual e of what compression dropped and
// folds it into the next gradient of that bucket:
//
//	e ← e + g;  c ← C(e);  e ← e − D(c)
//
// so that, summed over steps, every gradient component is eventually sent.
// With s = float32(e_old + g) (the sum rounded once, as the definition does),
// the invariant after each call is, per element, e_new == float32(s − D(c)):
// e_new + D(c) equals s within half an ulp of s.
//
// Calls for different buckets may run concurrently; calls for the same bucket
// are serialized. The memory is checkpointed with Save and Load.
type ErrorFeedback struct {
	c       Compressor
	mu      sync.Mutex
	buckets map[uint64]*residual
}

type residual struct {
	n   int // the bucket's length, fixed at creation (e is swapped under mu)
	mu  sync.Mutex
	e   []float32 // the residual
	sum []float32 // scratch: s = e + g
	dec []float32 // scratch: s − D(c), the residual a Commit installs
	sel []uint32  // scratch of a SparseCompressor: the indices c keeps
}

// NewErrorFeedback returns error-feedback memory, empty, in front of c.
func NewErrorFeedback(c Compressor) *ErrorFeedback {
	return &ErrorFeedback{c: c, buckets: map[uint64]*residual{}}
}

// Compressor returns the compressor the memory feeds.
func (f *ErrorFeedback) Compressor() Compressor { return f.c }

func (f *ErrorFeedback) bucket(id uint64, n int) (*residual, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.buckets[id]
	if !ok {
		r = &residual{n: n, e: make([]float32, n)}
		f.buckets[id] = r
	}
	if r.n != n {
		return nil, &SizeError{What: fmt.Sprintf("gradient length for bucket %d", id), Got: int64(n), Want: int64(r.n)}
	}
	return r, nil
}

// Compress folds grad into the residual of key.Bucket, appends the payload of
// the sum to dst and keeps what the payload dropped as the new residual. A
// bucket's first call sets its length; a later call with another length is a
// *SizeError. On any error (a NaN or Inf in grad, or in e+g, is a
// *NonFiniteError) dst is returned unchanged and the residual is untouched.
// It is Begin followed by Commit.
func (f *ErrorFeedback) Compress(dst []byte, grad []float32, key Key) ([]byte, error) {
	out, p, err := f.Begin(dst, grad, key)
	if err != nil {
		return dst, err
	}
	p.Commit()
	return out, nil
}

// Begin is the first phase of a Compress whose outcome is not known yet (the
// payload may fail to reach the other ranks). It computes s = e + g and
// appends the payload of s to dst exactly as Compress does, but leaves the
// residual as it was until the returned Pending is settled by one of its
// methods: Commit (e ← s − D(c), what Compress does), Retain (e ← s) or
// Discard (e unchanged). Until then the bucket is held: other calls on it
// (Compress, Begin, Residual, Save) wait, so every Begin must be settled. On
// error, as for Compress, dst is returned unchanged, the Pending is nil and
// the residual is untouched.
func (f *ErrorFeedback) Begin(dst []byte, grad []float32, key Key) ([]byte, *Pending, error) {
	r, err := f.bucket(key.Bucket, len(grad))
	if err != nil {
		return dst, nil, err
	}
	r.mu.Lock()
	if len(r.sum) != len(grad) {
		r.sum = make([]float32, len(grad))
	}
	var out []byte
	sparse := false
	switch c := f.c.(type) {
	case FeedbackCompressor:
		r.sizeDec()
		out, err = c.CompressFeedback(dst, r.e, grad, r.sum, key, r.dec)
	case SparseFeedbackCompressor:
		// The residual is s with +0 at the kept indices: Commit writes
		// those k zeros into s and installs it, no copy of s is made.
		sparse = true
		out, r.sel, err = c.CompressSelectFeedback(dst, r.e, grad, r.sum, key, r.sel[:0])
	case SparseCompressor:
		// One made elsewhere, without the fused pass: the sum pass first.
		sparse = true
		addKernel(r.sum, r.e, grad)
		out, r.sel, err = c.CompressSelect(dst, r.sum, key, r.sel[:0])
	default:
		// The residual Commit will install, computed now so that Commit
		// is a swap: a caller settling many buckets at once pays nothing
		// more.
		addKernel(r.sum, r.e, grad)
		r.sizeDec()
		out, err = CompressResidual(f.c, dst, r.sum, key, r.dec)
	}
	if err != nil {
		r.mu.Unlock()
		return dst, nil, err
	}
	return out, &Pending{r: r, sparse: sparse}, nil
}

// BeginResidual is Begin for an exchange that computes the residual
// itself, knowing it only after a collective (PowerSGD's: the residual
// depends on the averaged factor P). It sets s = e + g (rounded once, as
// Begin's sum) and returns s and res, a scratch of the bucket's length that
// the caller must fill with the residual before settling: Commit installs
// it (e ← res), Retain installs s, Discard keeps e. Until settled the
// bucket is held, as after Begin. s may hold NaN or ±Inf: the caller
// checks (and then must not Commit). The memory's compressor is not used.
func (f *ErrorFeedback) BeginResidual(grad []float32, key Key) (s, res []float32, p *Pending, err error) {
	r, err := f.bucket(key.Bucket, len(grad))
	if err != nil {
		return nil, nil, nil, err
	}
	r.mu.Lock()
	if len(r.sum) != len(grad) {
		r.sum = make([]float32, len(grad))
	}
	addKernel(r.sum, r.e, grad)
	r.sizeDec()
	return r.sum, r.dec, &Pending{r: r}, nil
}

// sizeDec gives the scratch r.dec the bucket's length.
func (r *residual) sizeDec() {
	if len(r.dec) != r.n {
		r.dec = make([]float32, r.n)
	}
}

// Flush is Begin for a gradient that goes uncompressed together with
// everything the bucket's memory holds: it sets grad[i] = s[i] with
// s = e + g (rounded once, as Begin's sum) and returns a Pending whose
// Commit empties the memory (e ← 0: all of s was delivered), Retain keeps
// e ← s and Discard leaves e as it was. A NaN or ±Inf in s is a
// *NonFiniteError for its lowest index; on any error grad, the memory and
// the Pending (nil) are as Begin leaves them.
func (f *ErrorFeedback) Flush(grad []float32, key Key) (*Pending, error) {
	r, err := f.bucket(key.Bucket, len(grad))
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	if len(r.sum) != len(grad) {
		r.sum = make([]float32, len(grad))
	}
	addKernel(r.sum, r.e, grad)
	for i, v := range r.sum {
		if v-v != 0 {
			r.mu.Unlock()
			return nil, &NonFiniteError{Index: i, Value: v}
		}
	}
	copy(grad, r.sum)
	return &Pending{r: r, flush: true}, nil
}

// FeedbackCompressor is a Compressor that folds error feedback's sum into
// its first pass; Parse returns one for int8, int4, int2, sign, fp16, bf16
// and none, and ErrorFeedback uses it to read e and g once per step.
// CompressFeedback sets sum[i] = e[i] + g[i] (one float32 addition) and
// then does exactly what CompressResidual(dst, sum, key, res) does, in the
// same pass. All four slices have g's length (else a *SizeError, dst
// unchanged); sum overlaps none of the others.
type FeedbackCompressor interface {
	Compressor
	CompressFeedback(dst []byte, e, g, sum []float32, key Key, res []float32) ([]byte, error)
}

// SparseFeedbackCompressor is a SparseCompressor that folds error
// feedback's sum into its first pass over the input, as a
// FeedbackCompressor does; Parse returns one for topk and randomk, and
// ErrorFeedback uses it to read e and g once per step and s only from
// cache. CompressSelectFeedback sets sum[i] = e[i] + g[i] (one float32
// addition) and does exactly what CompressSelect(dst, sum, key, sel) does,
// in the same pass. e and sum have g's length (else a *SizeError, dst and
// sel unchanged); sum overlaps neither. On error sum holds unspecified
// values.
type SparseFeedbackCompressor interface {
	SparseCompressor
	CompressSelectFeedback(dst []byte, e, g, sum []float32, key Key, sel []uint32) ([]byte, []uint32, error)
}

// SparseCompressor is a Compressor whose decoded payload is its input at
// the indices it keeps and +0 everywhere else (top-k, random-k), so that
// what error feedback keeps of an input s is s itself with +0 at those
// indices (s − s is +0 for finite s, s − (+0) is s, −0 included).
// ErrorFeedback uses it to keep the residual in place rather than write a
// copy of s. Parse returns one for topk and randomk specs.
type SparseCompressor interface {
	Compressor
	// CompressSelect is Compress that also appends to sel the indices the
	// payload keeps and returns it. On error dst and sel are returned
	// unchanged.
	CompressSelect(dst []byte, src []float32, key Key, sel []uint32) ([]byte, []uint32, error)
}

// ResidualCompressor is a Compressor that computes, with a payload, what
// error feedback keeps of its input, in fewer passes over memory than a
// Decompress of the payload and a subtraction. Every compressor Parse
// returns implements it.
type ResidualCompressor interface {
	Compressor
	// CompressResidual is Compress that also sets res[i] = src[i] − D[i]
	// (one float32 subtraction), where D is what Decompress sets from the
	// payload it appends. len(res) must equal len(src) (else a *SizeError)
	// and res must not overlap src. On error dst is returned unchanged and
	// res holds unspecified values.
	CompressResidual(dst []byte, src []float32, key Key, res []float32) ([]byte, error)
}

// CompressResidual appends c's payload for src to dst and sets res[i] =
// src[i] − D[i], D being the payload decoded, exactly as
// ResidualCompressor.CompressResidual does: through that method when c has
// it, else by Compress, Decompress into res and a subtraction. The
// contract on res and on errors is the method's.
func CompressResidual(c Compressor, dst []byte, src []float32, key Key, res []float32) ([]byte, error) {
	if rc, ok := c.(ResidualCompressor); ok {
		return rc.CompressResidual(dst, src, key, res)
	}
	if len(res) != len(src) {
		return dst, &SizeError{What: "residual length", Got: int64(len(res)), Want: int64(len(src))}
	}
	out, err := c.Compress(dst, src, key)
	if err != nil {
		return dst, err
	}
	if err := c.Decompress(res, out[len(dst):]); err != nil {
		return dst, fmt.Errorf("compress: %s cannot decode its own payload: %w", c.Spec(), err)
	}
	subtractFrom(res, src, serial)
	return out, nil
}

// Pending is a Begin not yet settled. Exactly one of its methods takes
// effect; later calls do nothing.
type Pending struct {
	once    sync.Once
	r       *residual
	sparse  bool // Begin kept the residual in place (SparseCompressor)
	flush   bool // a Flush: the payload is all of s
	scaled  bool // Scale wrote the residual Commit installs to r.dec
	settled bool // set by the settlement (Scale then does nothing)
}

// Commit records that the payload was delivered: e ← s − D(c), with s = e + g
// as Begin computed it (each element times Scale's factor after Scale).
func (p *Pending) Commit() { p.CommitMasked(nil) }

// CommitMasked is Commit that also zeroes u at the indices the payload
// kept, for a SparseCompressor (momentum factor masking: the velocity of
// the coordinates sent starts again from zero); for any other compressor
// it is Commit and u is untouched. u is the bucket's length.
func (p *Pending) CommitMasked(u []float32) {
	p.settle(func(r *residual) {
		if p.flush {
			clear(r.e)
			return
		}
		if !p.sparse || p.scaled {
			if p.sparse && u != nil {
				for _, i := range r.sel {
					u[i] = 0
				}
			}
			r.e, r.dec = r.dec, r.e
			return
		}
		for _, i := range r.sel {
			r.sum[i] = 0
		}
		if u != nil {
			for _, i := range r.sel {
				u[i] = 0
			}
		}
		r.e, r.sum = r.sum, r.e
	})
}

// Scale makes Commit install c·(s − D(c)) instead of s − D(c): every
// element of the residual multiplied by c, one float32 multiplication
// rounded to nearest even (kernels.ScaleStep's rule), as a decaying error
// feedback e ← β·(e + g − D(C(e + g))) needs (overlap's
// Config.FeedbackDecay, c = float32(β)). It does the pass over the bucket
// now, so that Commit stays a swap; a second call scales again. Retain and
// Discard are unaffected; HeldBack measures the scaled residual after it.
// A Flush's Pending ignores it (its Commit empties the memory). Of a BeginResidual, it scales the residual
// the caller wrote: call it after writing it. The caller that holds p
// calls it before settling; after the settlement it does nothing.
func (p *Pending) Scale(c float32) {
	if p.settled || p.flush {
		return
	}
	r := p.r
	if p.sparse && !p.scaled {
		// s with +0 at the kept indices, scaled, into the scratch that
		// Commit then swaps in; s stays for Retain.
		r.sizeDec()
		for i, v := range r.sum {
			r.dec[i] = c * v
		}
		for _, i := range r.sel {
			r.dec[i] = 0
		}
		p.scaled = true
		return
	}
	for i, v := range r.dec {
		r.dec[i] = c * v
	}
	p.scaled = true
}

// HeldBack returns the Euclidean norm of the residual Commit would
// install, s − D(c) (a Flush's is 0; after Scale, the scaled residual), in
// float64: the squares summed in increasing index order, for a
// SparseCompressor not scaled those of all of s less those of the kept
// indices. The same inputs give the same bits. It reads the bucket without
// settling it.
func (p *Pending) HeldBack() float64 {
	r := p.r
	var sum float64
	switch {
	case p.flush:
		return 0
	case p.sparse && !p.scaled:
		// s with +0 at the kept indices.
		for _, v := range r.sum {
			sum += float64(v) * float64(v)
		}
		for _, i := range r.sel {
			v := float64(r.sum[i])
			sum -= v * v
		}
		sum = max(sum, 0)
	default:
		for _, v := range r.dec {
			sum += float64(v) * float64(v)
		}
	}
	return math.Sqrt(sum)
}

// Retain records that the payload was lost: e ← s = e + g, so the whole
// gradient stays in memory for a later step and nothing of it is lost.
// (Begin writes all of s again, so the old e becomes its scratch.)
func (p *Pending) Retain() { p.settle(func(r *residual) { r.e, r.sum = r.sum, r.e }) }

// Discard records that the gradient was delivered another way (uncompressed):
// the residual keeps the value it had before Begin.
func (p *Pending) Discard() { p.settle(func(*residual) {}) }

func (p *Pending) settle(apply func(r *residual)) {
	p.once.Do(func() {
		p.settled = true
		apply(p.r)
		p.r.mu.Unlock()
	})
}

// Residual returns a copy of the residual of a bucket, or nil if the bucket
// has not been compressed yet.
func (f *ErrorFeedback) Residual(bucket uint64) []float32 {
	f.mu.Lock()
	r, ok := f.buckets[bucket]
	f.mu.Unlock()
	if !ok {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]float32(nil), r.e...)
}

// SetResidual installs a copy of e as the residual of bucket, replacing the
// one it had (its length becomes len(e)): how memory kept elsewhere, such as
// a GPU's, joins a checkpoint written by Save. A Begin of the bucket not yet
// settled keeps working on the memory it replaced, which is then dropped. A
// NaN or ±Inf in e is a *NonFiniteError and more than MaxElements values a
// *SizeError; on error nothing changes.
func (f *ErrorFeedback) SetResidual(bucket uint64, e []float32) error {
	if int64(len(e)) > MaxElements {
		return &SizeError{What: fmt.Sprintf("residual length for bucket %d", bucket), Got: int64(len(e)), Want: MaxElements}
	}
	for i, v := range e {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return &NonFiniteError{Index: i, Value: v}
		}
	}
	r := &residual{n: len(e), e: append(make([]float32, 0, len(e)), e...)}
	f.mu.Lock()
	f.buckets[bucket] = r
	f.mu.Unlock()
	return nil
}

// Buckets returns the keys of the buckets that have memory, ascending.
func (f *ErrorFeedback) Buckets() []uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := make([]uint64, 0, len(f.buckets))
	for id := range f.buckets {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// Reset forgets every residual.
func (f *ErrorFeedback) Reset() {
	f.mu.Lock()
	f.buckets = map[uint64]*residual{}
	f.mu.Unlock()
}

// The checkpoint format, version 1, little-endian:
//
//	"GCEF", version (1 byte), bucket count (uint32),
//	per bucket ascending by key: key (uint64), length n (uint64), n float32,
//	CRC32C of every byte before it (uint32).
const (
	efMagic   = "GCEF"
	efVersion = 1
	efChunk   = 1 << 16 // elements read per step, so a lying length cannot make Load allocate ahead of the data
)

// Save writes every residual to w in a versioned, checksummed format that
// Load reads back exactly.
func (f *ErrorFeedback) Save(w io.Writer) error {
	ids := f.Buckets()
	crc := crc32.New(castagnoli)
	bw := bufio.NewWriter(io.MultiWriter(w, crc))
	bw.WriteString(efMagic)
	bw.WriteByte(efVersion)
	var b [8]byte
	binary.LittleEndian.PutUint32(b[:4], uint32(len(ids)))
	bw.Write(b[:4])
	for _, id := range ids {
		e := f.Residual(id)
		binary.LittleEndian.PutUint64(b[:], id)
		bw.Write(b[:])
		binary.LittleEndian.PutUint64(b[:], uint64(len(e)))
		bw.Write(b[:])
		for _, v := range e {
			binary.LittleEndian.PutUint32(b[:4], math.Float32bits(v))
			bw.Write(b[:4])
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("compress: saving error-feedback state: %w", err)
	}
	binary.LittleEndian.PutUint32(b[:4], crc.Sum32())
	if _, err := w.Write(b[:4]); err != nil {
		return fmt.Errorf("compress: saving error-feedback state: %w", err)
	}
	return nil
}

// Load replaces the memory with the state Save wrote to r. The state is
// validated whole (magic, version, lengths, finite values, checksum) before
// anything is replaced: on error the memory is unchanged. Buckets are matched
// by key, so a state saved under one world size loads under another.
func (f *ErrorFeedback) Load(r io.Reader) error {
	crc := crc32.New(castagnoli)
	lr := &offsetReader{r: io.TeeReader(r, crc)}
	var hdr [9]byte
	if err := lr.full(hdr[:]); err != nil {
		return err
	}
	if string(hdr[:4]) != efMagic {
		return &CorruptInputError{Offset: 0, Reason: fmt.Sprintf("bad error-feedback magic %q, want %q", hdr[:4], efMagic)}
	}
	if hdr[4] != efVersion {
		return &VersionError{What: "error-feedback state", Got: hdr[4], Want: efVersion}
	}
	count := binary.LittleEndian.Uint32(hdr[5:])
	buckets := make(map[uint64]*residual, min(count, 1024))
	var b [16]byte
	for range count {
		at := lr.off
		if err := lr.full(b[:]); err != nil {
			return err
		}
		id, n := binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:])
		if n > MaxElements {
			return &CorruptInputError{Offset: at + 8, Reason: fmt.Sprintf("bucket %d length %d exceeds %d", id, n, uint64(MaxElements))}
		}
		if _, dup := buckets[id]; dup {
			return &CorruptInputError{Offset: at, Reason: fmt.Sprintf("bucket %d appears twice", id)}
		}
		var e []float32
		raw := make([]byte, 4*min(n, efChunk))
		for left := n; left > 0; {
			chunk := raw[:4*min(left, efChunk)]
			start := lr.off
			if err := lr.full(chunk); err != nil {
				return err
			}
			for i := 0; i < len(chunk); i += 4 {
				v := math.Float32frombits(binary.LittleEndian.Uint32(chunk[i:]))
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					return &CorruptInputError{Offset: start + int64(i), Reason: fmt.Sprintf("non-finite residual in bucket %d", id)}
				}
				e = append(e, v)
			}
			left -= uint64(len(chunk) / 4)
		}
		if e == nil {
			e = []float32{}
		}
		buckets[id] = &residual{n: len(e), e: e}
	}
	want := crc.Sum32()
	var sum [4]byte
	if _, err := io.ReadFull(r, sum[:]); err != nil {
		return &CorruptInputError{Offset: lr.off, Reason: "error-feedback state truncated before its checksum"}
	}
	if got := binary.LittleEndian.Uint32(sum[:]); got != want {
		return &ChecksumError{Got: got, Want: want}
	}
	f.mu.Lock()
	f.buckets = buckets
	f.mu.Unlock()
	return nil
}

// offsetReader reads exactly, counting bytes, and reports a short read as a
// CorruptInputError at the offset where data ran out.
type offsetReader struct {
	r   io.Reader
	off int64
}

func (o *offsetReader) full(p []byte) error {
	n, err := io.ReadFull(o.r, p)
	o.off += int64(n)
	if err != nil {
		return &CorruptInputError{Offset: o.off, Reason: fmt.Sprintf("error-feedback state truncated (%v)", err)}
	}
	return nil
}
