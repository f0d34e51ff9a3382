package compress

import (
	"encoding/binary"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Top-k selection by radix select on magnitude keys.
//
// The key of x is its bit pattern without the sign, key(x) = bits(x) & 0x7fffffff.
// For finite x keys order like |x| (-0 and +0 share key 0); +Inf is
// 0x7f800000 and NaNs lie above it, so key ≥ 0x7f800000 means non-finite.
// The selected set is the k elements with the largest keys, ties broken
// toward the lower index: with T the k-th largest key, every element with
// key > T plus the lowest-index elements with key == T, as many as make k.
//
// The exact selection (AIR top-k style) splits the 31 key bits into digits of
// 11, 11 and 9 bits. Each level histograms one digit of the still undecided
// elements (those whose key agrees with the digits picked so far) and picks
// the bin holding the k-th largest; bins above it are decided in.
//
// The first level reads the whole input once, and in that one pass counts
// the top digits, notices non-finite values (their keys fill the top bins)
// and gathers candidates: each worker keeps a bound on the digit of the k-th
// largest key, which rises as soon as k of the elements it has read lie
// above it (see histTop), and copies, in index order, the elements at or
// above its bound (the first k it reads, then ever fewer: about
// k·(1 + ln(n/k)) in all, 5.6·k at ratio 0.01) into candidate lists, while
// keys below the bound are skipped 32 at a time. After the first pick the
// lists are cut to the elements with key ≥ the bin picked (1.1·k to 1.25·k
// for a Laplace gradient at ratios 0.001 to 0.1), and the next levels and
// the output read them instead of the input.
//
// Passes over the input (a bucket of n floats in memory), exact path:
// before issue 10 two, a histogram of every element and a copy of the
// candidates; now one. The sampled path makes one before and after (the
// sample is 64Ki elements, the candidates about k). Both then make three
// passes over their candidates (two levels and the output; the exact path
// one more to cut its lists). When the gathered candidates would exceed n/8
// + k (many ties: all-equal or coarsely quantized input, or a large ratio),
// gathering stops, and the input is read again to copy the candidates once
// the first level has picked, or, with too many undecided, by the next
// levels themselves: up to three histogram passes and one output pass.
//
// Under error feedback (sparseCodec.encodeSum) the input is the sum s =
// e + g, which the first pass over the input (the first level, or the
// sampled path's collection) writes itself: gathering sets 32 elements at
// a time to e + g and tests the sums in registers (addCollectKernel); the
// first level's other kernels, which run once gathering has stopped, get
// blocks of sumBlock elements summed just before and read back from cache
// (foldSum). Before issue 10 a pass of its own wrote s (reading e and g)
// and the selection read s back from memory: two passes, four
// bucket-sized streams; now one pass, three streams (e and g read, s
// written). The sampled path's estimate samples s by summing its 64Ki
// elements directly. Where the sampled path gives up mid-collection, the
// exact path's first level sets what of s is still unset (and the rest
// again, to the same values).
//
// The input is cut into segments whose layout depends on n alone; passes run
// segment by segment over the runner, with per-segment histograms and
// prefix sums for the output offsets, so the bytes do not depend on the
// number of workers.
const (
	signMask     = 0x7fffffff
	nonFiniteKey = 0x7f800000 // the key of +Inf; keys at or above it are Inf or NaN
	histBins     = 1 << 11    // the widest digit

	segMinLen = 1 << 16 // input elements per segment, at least …
	maxSegs   = 64      // … unless that would make more segments than this

	collectBlock = 1 << 14 // elements scanned between checks of the candidate limit
)

// radixLevels are the digits of a key, most significant first.
var radixLevels = [...]struct{ shift, bits uint32 }{{20, 11}, {9, 11}, {0, 9}}

// magKey returns the magnitude key of x.
func magKey(x float32) uint32 { return math.Float32bits(x) & signMask }

// The scans for large elements (collecting candidates, writing the output,
// looking for non-finite values) skip runs of small elements eight at a
// time: groupAtLeast reads them as four 64-bit words of two lanes each.
// With its sign bit forced on, a lane L is ≥ 2^31 ≥ t, so L − t borrows
// nothing from the next lane and keeps its top bit exactly when key ≥ t.
// Both lanes are tested alike, so byte order does not matter; words are
// read at 8-byte-aligned addresses only (a scan handles the one element
// before the first such address on its own, see misaligned).
const laneSigns = 0x80000000_80000000

// lanes returns t in both 32-bit lanes of a word; t ≤ 1<<31.
func lanes(t uint32) uint64 { return uint64(t)<<32 | uint64(t) }

// groupAtLeast reports whether one of the eight elements from p on, which
// must be 8-byte aligned and in one slice, has a key ≥ t (t2 = lanes(t)).
func groupAtLeast(p *float32, t2 uint64) bool {
	w := (*[4]uint64)(unsafe.Pointer(p))
	l0, l1, l2, l3 := (w[0]|laneSigns)-t2, (w[1]|laneSigns)-t2, (w[2]|laneSigns)-t2, (w[3]|laneSigns)-t2
	return (l0|l1|l2|l3)&laneSigns != 0
}

// misaligned returns how many leading elements of vals lie before an
// 8-byte-aligned address: 0 or 1 (0 for an empty slice).
func misaligned(vals []float32) int {
	if len(vals) > 0 && uintptr(unsafe.Pointer(&vals[0]))%8 != 0 {
		return 1
	}
	return 0
}

// atLeast returns 1 if key(x) ≥ t, else 0, without a branch; t ≤ 1<<31.
func atLeast(x float32, t uint32) int { return int((math.Float32bits(x) | 1<<31 - t) >> 31) }

// firstAtLeast returns the lowest i with magKey(vals[i]) ≥ t, or -1; t ≤ 1<<31.
func firstAtLeast(vals []float32, t uint32) int {
	t2 := lanes(t)
	i := 0
	for end := misaligned(vals); ; end = min(i+8, len(vals)) {
		for ; i < end; i++ {
			if magKey(vals[i]) >= t {
				return i
			}
		}
		for i+8 <= len(vals) && !groupAtLeast(&vals[i], t2) {
			i += 8
		}
		if i == len(vals) {
			return -1
		}
	}
}

// firstNonFinite returns the lowest i with a NaN or ±Inf in blk[i], or -1,
// as firstAtLeast(blk, nonFiniteKey) does. Unless add is none it first
// sets blk to its e + g, in the same pass: it collects the keys at or
// above +Inf's with addCollectKernel, which tests the sums in registers
// as it writes them, a collectBlock at a time so that a block full of
// NaNs collects no more than that.
func firstNonFinite(blk []float32, add addends) int {
	if add.e == nil {
		return firstAtLeast(blk, nonFiniteKey)
	}
	sc := nonFinitePool.Get().(*nonFiniteScratch)
	defer nonFinitePool.Put(sc)
	for lo := 0; lo < len(blk); lo += collectBlock {
		hi := min(lo+collectBlock, len(blk))
		if pos, _ := collectAtLeast(&sc.hist, sc.pos[:0], sc.vals[:0], blk[lo:hi], add.from(lo), lo, nonFiniteKey); len(pos) > 0 {
			return int(pos[0])
		}
	}
	return -1
}

// nonFiniteScratch is what firstNonFinite's collection writes to, hits
// alone: the lists (as much room as collectAtLeast asks for, so that it
// allocates only for hits) and a histogram nothing reads.
type nonFiniteScratch struct {
	hist [histBins]uint32
	pos  [4 * collectStep]uint32
	vals [4 * collectStep]float32
}

// nonFinitePool keeps firstNonFinite's scratch between calls.
var nonFinitePool = sync.Pool{New: func() any { return new(nonFiniteScratch) }}

// addends are error feedback's e and g for a run of the input whose sum
// s = e + g is still to be written, aligned with it (e[i] and g[i] make
// element i, at least as many as the run has), or none (e nil): the run
// holds its values already.
type addends struct{ e, g []float32 }

// from returns the addends of the run from its element i on.
func (a addends) from(i int) addends {
	if a.e == nil {
		return a
	}
	return addends{a.e[i:], a.g[i:]}
}

// sumBlock is how many elements foldSum sets to e + g before handing them
// on: few enough that the blocks of e, g and the sum (64 KiB each) stay in
// a core's L2 cache until the pass reads the sum back, enough that the
// kernels' per-call costs (histTopKernel clears and folds 24 KiB of
// histograms) stay small beside the block's.
const sumBlock = 1 << 14

// foldSum calls f on consecutive blocks of s until f returns true. Unless
// add is none it first sets each block to its e + g (addKernel) and hands
// f blocks of sumBlock elements at most, so that error feedback's sum is
// written in the pass f makes and read back from cache; otherwise f gets
// all of s at once.
func foldSum(s []float32, add addends, f func(blk []float32) (stop bool)) {
	if add.e == nil {
		f(s)
		return
	}
	for lo := 0; lo < len(s); lo += sumBlock {
		blk := s[lo:min(lo+sumBlock, len(s))]
		addKernel(blk, add.e[lo:], add.g[lo:])
		if f(blk) {
			return
		}
	}
}

// collectAtLeast appends to pos and vals every element of blk with key ≥ t
// (blk[i] has input index base+i), in order, and counts their top digits
// in h: the first element alone if it lies off an 8-byte boundary (so that
// collectGeneric reads aligned words), collectKernel for whole steps, then
// the rest one by one. Unless add is none it first sets each element of
// blk to its e + g, in the same pass (addCollectKernel).
func collectAtLeast(h *[histBins]uint32, pos []uint32, vals []float32, blk []float32, add addends, base int, t uint32) ([]uint32, []float32) {
	head := misaligned(blk)
	pos, vals = appendAtLeast(h, pos, vals, blk[:head], add, base, t)
	blk, add, base = blk[head:], add.from(head), base+head
	for len(blk) >= collectStep {
		m := len(pos)
		if min(cap(pos), cap(vals))-m < 4*collectStep {
			grow := max(4*collectStep, m) // doubling: a list built from nothing is copied once in all
			pos, vals = slices.Grow(pos, grow), slices.Grow(vals, grow)
		}
		var read, wrote int
		if add.e == nil {
			read, wrote = collectKernel(h, pos[m:cap(pos)], vals[m:cap(vals)], blk, uint32(base), t)
		} else {
			read, wrote = addCollectKernel(h, pos[m:cap(pos)], vals[m:cap(vals)], blk, add.e, add.g, uint32(base), t)
		}
		pos, vals = pos[:m+wrote], vals[:m+wrote]
		blk, add, base = blk[read:], add.from(read), base+read
	}
	return appendAtLeast(h, pos, vals, blk, add, base, t)
}

// appendAtLeast is collectAtLeast one element at a time.
func appendAtLeast(h *[histBins]uint32, pos []uint32, vals []float32, blk []float32, add addends, base int, t uint32) ([]uint32, []float32) {
	for i := range blk {
		if add.e != nil {
			blk[i] = add.e[i] + add.g[i]
		}
		x := blk[i]
		if u := magKey(x); u >= t {
			pos, vals = append(pos, uint32(base+i)), append(vals, x)
			h[u>>20&(histBins-1)]++
		}
	}
	return pos, vals
}

// collectStep is how many elements collectKernel tests at a time.
const collectStep = 32

// collectKernel writes to pos and vals, from their first slots on, the
// input index base+i and the value x[i] of every element with key ≥ t
// (t ≤ 1<<31), in order, and adds 1 to h[key>>20] for each. It reads x a
// step of collectStep elements at a time while a whole step is left and
// collectStep slots are free in both pos and vals, and returns how many
// elements it read and how many it wrote. Slots past the written ones, up
// to that room, may change.
var collectKernel = collectGeneric

// collectGeneric is the reference collectKernel. It reads as many whole
// steps at a time as the room left allows, skips groups of eight without a
// hit (groupAtLeast, where x starts on an 8-byte boundary) and compacts a
// group with one without branches.
func collectGeneric(h *[histBins]uint32, pos []uint32, vals []float32, x []float32, base, t uint32) (read, wrote int) {
	room := min(len(pos), len(vals))
	t2, aligned := lanes(t), misaligned(x) == 0
	steps := len(x) &^ (collectStep - 1)
	for read < steps && room-wrote >= collectStep {
		// At most end − read elements are written before end: the room
		// stays ≥ collectStep at every step boundary on the way.
		end := min(steps, read+(room-wrote)&^(collectStep-1))
		for g := read; ; g += 8 {
			for aligned && g < end && !groupAtLeast(&x[g], t2) {
				g += 8
			}
			if g == end {
				break
			}
			p, w := pos[wrote:wrote+8], vals[wrote:wrote+8]
			c := 0
			for j, v := range x[g : g+8] {
				p[c&7], w[c&7] = base+uint32(g+j), v
				c += atLeast(v, t)
			}
			for _, v := range w[:c] {
				h[magKey(v)>>20&(histBins-1)]++
			}
			wrote += c
		}
		read = end
	}
	return read, wrote
}

// addCollectKernel is collectKernel that first sets each element x[i] it
// reads to e[i] + g[i] (one float32 addition; e and g at least as long as
// x): error feedback's sum, tested as it is written.
var addCollectKernel = addCollectGeneric

// addCollectGeneric is the reference addCollectKernel: addGeneric, then
// collectGeneric, on as many whole steps at a time as the room left
// allows, which collectGeneric then reads all of.
func addCollectGeneric(h *[histBins]uint32, pos []uint32, vals []float32, x, e, g []float32, base, t uint32) (read, wrote int) {
	room := min(len(pos), len(vals))
	for {
		m := min(len(x)-read, room-wrote) &^ (collectStep - 1)
		if m == 0 {
			return read, wrote
		}
		addGeneric(x[read:read+m], e[read:], g[read:])
		r, w := collectGeneric(h, pos[wrote:], vals[wrote:], x[read:read+m], base+uint32(read), t)
		read, wrote = read+r, wrote+w
	}
}

// segment is a run of elements selection reads: a slice of the input at
// index base (pos == nil), or a candidate list whose element i has input
// index pos[i].
type segment struct {
	vals []float32
	pos  []uint32
	base int
}

func (s *segment) index(i int) int {
	if s.pos == nil {
		return s.base + i
	}
	return int(s.pos[i])
}

// candidates is the list collected from one input segment.
type candidates struct {
	pos  []uint32
	vals []float32
}

// topkScratch is the reusable memory of one top-k call.
type topkScratch struct {
	input  []segment
	cand   []candidates
	cands  []segment
	hist   []uint32 // histBins per segment
	total  [histBins]int
	above  []int // per segment: elements decided in
	eq     []int // per segment: elements in the undecided bin
	off    []int // per segment: output offset
	take   []int // per segment: elements equal to the threshold it outputs
	sample []float32

	// add holds error feedback's addends of the whole input while its
	// sum is still to be written, else none (see addendsOf).
	add addends
}

var topkScratchPool = sync.Pool{New: func() any { return new(topkScratch) }}

// selectTopK writes the top-k body of src (k ascending uint32 indices, then
// their k float32 values) into body, len(body) == 8k, 1 ≤ k ≤ len(src). A
// NaN or Inf in src is a *NonFiniteError for the lowest such index, and
// body is then left unwritten. sampled tries the sampled-threshold shortcut
// first; both paths write the same bytes. Unless e is nil, src is error
// feedback's sum, which the first pass over the input sets to e + g (of
// src's length) as it reads it (sparseCodec.encodeSum).
func selectTopK(body []byte, e, g, src []float32, k int, sampled bool, run runner) error {
	sc := topkScratchPool.Get().(*topkScratch)
	defer func() {
		clear(sc.input) // the pool must not keep the caller's gradient alive
		sc.add = addends{}
		topkScratchPool.Put(sc)
	}()
	sc.splitInput(src)
	sc.add = addends{e, g}
	if sampled && len(src) >= sampledMinLen && k <= len(src)/sampledMaxInv {
		if done, err := sc.sampled(body, src, k, run); done {
			return err
		}
	}
	// Candidates are copied once at most n/8 more than k would be.
	return sc.start(sc.input, k, true).finish(body, k, len(src)/8+k, run)
}

// splitInput cuts src into segments whose layout depends on len(src) alone.
func (sc *topkScratch) splitInput(src []float32) {
	n := len(src)
	segs := min(max((n+segMinLen-1)/segMinLen, 1), maxSegs)
	sc.input = sc.input[:0]
	for s := range segs {
		lo, hi := s*n/segs, (s+1)*n/segs
		sc.input = append(sc.input, segment{vals: src[lo:hi], base: lo})
	}
}

// selection is the state of one radix selection: an element of segs is
// undecided while key>>shift == prefix; above[s] elements of segment s are
// decided in, and need more are wanted from the undecided.
type selection struct {
	sc      *topkScratch
	segs    []segment
	onInput bool // segs are slices of the input, not candidate lists
	shift   uint32
	prefix  uint32
	need    int

	// gather makes the first level's histogram collect, into sc.cand, the
	// elements it counts while fewer than gatherLimit have been gathered.
	gather      bool
	gatherLimit int64
	gathered    atomic.Int64
}

// start begins a selection of the need largest keys among segs, which are
// slices of the input if onInput.
func (sc *topkScratch) start(segs []segment, need int, onInput bool) *selection {
	n := len(segs)
	sc.hist = slices.Grow(sc.hist[:0], n*histBins)[:n*histBins]
	sc.above = resetInts(sc.above, n)
	sc.eq = resetInts(sc.eq, n)
	return &selection{sc: sc, segs: segs, onInput: onInput, shift: 31, need: need}
}

func resetInts(s []int, n int) []int {
	s = slices.Grow(s[:0], n)[:n]
	clear(s)
	return s
}

// finish runs every level, collects candidates from the input once at most
// collectLimit of them would be copied, checks for non-finite values after
// the first level and writes the selected elements to body.
func (sel *selection) finish(body []byte, k, collectLimit int, run runner) error {
	if sel.onInput {
		sel.gather, sel.gatherLimit = true, int64(collectLimit)
		sel.sc.resetCands(len(sel.segs))
	}
	for l := range radixLevels {
		sel.histogram(l, run)
		if l == 0 {
			if sel.onInput {
				sel.sc.add = addends{} // the first level has written the whole sum
			}
			if err := sel.nonFinite(); err != nil {
				return err
			}
		}
		sel.pick(l)
		if l == 0 && sel.gather && sel.gathered.Load() <= sel.gatherLimit {
			sel.useGathered(run)
		}
		if sel.onInput && l < len(radixLevels)-1 && sel.undecidedAndAbove() <= collectLimit {
			sel.collectFromInput(run)
		}
	}
	sel.emit(body, k, run)
	return nil
}

// histogram counts, per segment, the level-l digit of the undecided keys.
func (sel *selection) histogram(l int, run runner) {
	lv := radixLevels[l]
	mask := uint32(1)<<lv.bits - 1
	run(len(sel.segs), 1, func(lo, hi int) {
		if sel.shift == 31 {
			sel.histTop(lo, hi)
			return
		}
		for s := lo; s < hi; s++ {
			h := sel.sc.segHist(s)
			clear(h[:])
			histUndecided(h, sel.segs[s].vals, sel.shift, sel.prefix, lv.shift, mask)
		}
	})
	total := &sel.sc.total
	clear(total[:])
	for s := range sel.segs {
		h := sel.sc.hist[s*histBins : s*histBins+int(mask)+1]
		for b, c := range h {
			total[b] += int(c)
		}
	}
}

// segHist returns the histogram of segment s.
func (sc *topkScratch) segHist(s int) *[histBins]uint32 {
	return (*[histBins]uint32)(sc.hist[s*histBins:])
}

// histTopChunk is how many elements the first level counts between checks
// of its bound.
const histTopChunk = 1 << 16

// histTop counts the top digits (key>>20) of segments lo to hi−1, each
// segment into its own histogram, exactly for every digit from the one
// holding the need-th largest key up and perhaps not below. It keeps a
// bound: once need of the elements counted so far have digits above it,
// the need-th largest key of the whole input does too, so the bound goes
// up and later elements below it are skipped (histAtLeastKernel) rather
// than counted. The bound only rises, so every segment here has exact
// counts from the final bound up; pick reads no lower bin. On a gradient
// at ratio 0.01 all but a few percent of the elements are skipped, 32 at a
// time. Where the bound skips little (a chunk with more than a quarter of
// its elements at or above it: magnitudes growing with the index, or a
// large ratio), the next chunk is counted whole, which is faster then and
// as exact (extra counts land below the bound only). The result does not
// depend on how segments are split among workers: each keeps its own
// bound, and every bound is at most the digit pick settles on.
func (sel *selection) histTop(lo, hi int) {
	sc := sel.sc
	bound, counted := uint32(0), 0 // counted: elements with digit ≥ bound so far
	dense := true                  // whether the last chunk had more than a quarter at or above the bound
	for s := lo; s < hi; s++ {
		h := sc.segHist(s)
		clear(h[:])
		vals := sel.segs[s].vals
		for from := 0; from < len(vals); from += histTopChunk {
			chunk := vals[from:min(from+histTopChunk, len(vals))]
			at := sel.segs[s].base + from
			add := sel.addendsOf(at, len(chunk))
			var c int
			switch {
			case sel.gather && sel.gathered.Load() <= sel.gatherLimit:
				c = sc.collectInto(s, chunk, add, at, bound<<20)
				sel.gathered.Add(int64(c))
			case dense:
				// Once gathering has stopped (rare inputs, see finish),
				// the sum is set a block at a time and read from cache.
				c = -binsFrom(h, bound)
				foldSum(chunk, add, func(blk []float32) bool {
					histTopKernel(h, blk)
					return false
				})
				c += binsFrom(h, bound)
			default:
				foldSum(chunk, add, func(blk []float32) bool {
					c += histAtLeastKernel(h, blk, bound<<20)
					return false
				})
			}
			counted += c
			dense = c > len(chunk)/4
			for bound < histBins-1 {
				inBound := 0
				for r := lo; r <= s; r++ {
					inBound += int(sc.hist[r*histBins+int(bound)])
				}
				if counted-inBound < sel.need {
					break
				}
				counted -= inBound
				bound++
			}
		}
	}
}

// addendsOf returns the addends of the n elements from input index at
// on, which the segments hold: none on samples and candidate lists, whose
// values are sums already.
func (sel *selection) addendsOf(at, n int) addends {
	if !sel.onInput {
		return addends{}
	}
	return sel.sc.addendsOf(at, n)
}

// addendsOf returns the addends of the n input elements from index at
// on: none once the input's sum is written.
func (sc *topkScratch) addendsOf(at, n int) addends {
	if sc.add.e == nil {
		return addends{}
	}
	return addends{sc.add.e[at : at+n], sc.add.g[at : at+n]}
}

// binsFrom returns the count in h from bin b up.
func binsFrom(h *[histBins]uint32, b uint32) int {
	n := 0
	for _, c := range h[b:] {
		n += int(c)
	}
	return n
}

// histTopKernel adds to h[d] the number of elements of vals whose top
// digit key>>20 is d; the first level's histogram, whose top bins also
// count the non-finite values.
var histTopKernel = histTopGeneric

// histTopGeneric is the reference histTopKernel.
func histTopGeneric(h *[histBins]uint32, vals []float32) {
	for _, x := range vals {
		h[math.Float32bits(x)>>20&(histBins-1)]++
	}
}

// histAtLeastKernel adds to h[d] the number of elements of vals with key ≥
// t (t ≤ 1<<31) whose top digit is d, and returns how many it counted.
var histAtLeastKernel = histAtLeastGeneric

// histAtLeastGeneric is the reference histAtLeastKernel. It skips groups
// of eight without a hit (groupAtLeast) from the first 8-byte boundary on.
func histAtLeastGeneric(h *[histBins]uint32, vals []float32, t uint32) (counted int) {
	head := misaligned(vals)
	counted, vals = countAtLeast(h, vals[:head], t), vals[head:]
	t2, m := lanes(t), len(vals)&^7
	for i := 0; i < m; i += 8 {
		if groupAtLeast(&vals[i], t2) {
			counted += countAtLeast(h, vals[i:i+8], t)
		}
	}
	return counted + countAtLeast(h, vals[m:], t)
}

// countAtLeast is histAtLeastGeneric one element at a time.
func countAtLeast(h *[histBins]uint32, vals []float32, t uint32) (counted int) {
	for _, x := range vals {
		if u := magKey(x); u >= t {
			h[u>>20&(histBins-1)]++
			counted++
		}
	}
	return counted
}

// histUndecided counts digit (key>>shift)&mask of the elements with
// key>>pshift == prefix. It adds the match (0 or 1) instead of branching on
// it, since about as many elements match as not.
func histUndecided(h *[histBins]uint32, vals []float32, pshift, prefix, shift, mask uint32) {
	for _, x := range vals {
		u := magKey(x)
		h[u>>shift&mask&(histBins-1)] += (u>>pshift ^ prefix - 1) >> 31 // 1 iff equal: both sides < 2^31
	}
}

// nonFinite returns a *NonFiniteError for the first Inf or NaN of the
// segments, which the first level's histogram has counted in its top bins.
func (sel *selection) nonFinite() error {
	bad := 0
	for _, c := range sel.sc.total[nonFiniteKey>>20:] {
		bad += c
	}
	if bad == 0 {
		return nil
	}
	for _, seg := range sel.segs {
		if i := firstAtLeast(seg.vals, nonFiniteKey); i >= 0 {
			return &NonFiniteError{Index: seg.index(i), Value: seg.vals[i]}
		}
	}
	return nil
}

// pick chooses the level-l bin holding the need-th largest undecided key:
// bins above it are decided in, the elements in it stay undecided.
func (sel *selection) pick(l int) {
	lv := radixLevels[l]
	b := int(1)<<lv.bits - 1
	in := 0
	for ; in+sel.sc.total[b] < sel.need; b-- {
		in += sel.sc.total[b]
	}
	sel.need -= in
	for s := range sel.segs {
		h := sel.sc.hist[s*histBins : (s+1)*histBins]
		for _, c := range h[b+1 : 1<<lv.bits] {
			sel.sc.above[s] += int(c)
		}
		sel.sc.eq[s] = int(h[b])
	}
	sel.prefix = sel.prefix<<lv.bits | uint32(b)
	sel.shift = lv.shift
}

// undecidedAndAbove returns how many elements have key ≥ prefix<<shift.
func (sel *selection) undecidedAndAbove() int {
	n := 0
	for s := range sel.segs {
		n += sel.sc.above[s] + sel.sc.eq[s]
	}
	return n
}

// collectFromInput replaces the input segments by candidate lists of their
// elements with key ≥ prefix<<shift, whose counts pick has just made known.
func (sel *selection) collectFromInput(run runner) {
	sc := sel.sc
	sc.resetCands(len(sel.segs))
	for s := range sel.segs {
		c := &sc.cand[s]
		want := sc.above[s] + sc.eq[s] + 4*collectStep // the room collectAtLeast asks for
		c.pos = slices.Grow(c.pos[:0], want)
		c.vals = slices.Grow(c.vals[:0], want)
	}
	sc.collect(sel.segs, sel.prefix<<sel.shift, math.MaxInt, run)
	sel.segs, sel.onInput = sc.cands, false
}

// useGathered replaces the input segments by the candidate lists the first
// level gathered, less their elements below the bin pick chose (gathered
// under a lower bound), so that the next levels and the output read only
// elements with key ≥ prefix<<shift.
func (sel *selection) useGathered(run runner) {
	sc, t := sel.sc, sel.prefix<<sel.shift
	run(len(sel.segs), 1, func(lo, hi int) {
		for s := lo; s < hi; s++ {
			c := &sc.cand[s]
			j := 0
			for i, x := range c.vals {
				c.pos[j], c.vals[j] = c.pos[i], x
				j += atLeast(x, t)
			}
			c.pos, c.vals = c.pos[:j], c.vals[:j]
		}
	})
	sel.segs, sel.onInput = sc.candSegments(len(sel.segs)), false
}

// resetCands empties the candidate lists of n segments (keeping their
// memory) and sizes the histograms that collecting counts into.
func (sc *topkScratch) resetCands(n int) {
	if len(sc.cand) < n {
		sc.cand = append(sc.cand, make([]candidates, n-len(sc.cand))...)
	}
	for s := range n {
		sc.cand[s].pos, sc.cand[s].vals = sc.cand[s].pos[:0], sc.cand[s].vals[:0]
	}
	sc.hist = slices.Grow(sc.hist[:0], n*histBins)[:n*histBins]
}

// collectInto appends the elements of blk (input index base on) with key
// ≥ t to segment s's candidates, counts their top digits in its histogram
// and returns how many it appended; unless add is none it first sets blk
// to e + g, in the same pass.
func (sc *topkScratch) collectInto(s int, blk []float32, add addends, base int, t uint32) int {
	c := &sc.cand[s]
	before := len(c.pos)
	c.pos, c.vals = collectAtLeast(sc.segHist(s), c.pos, c.vals, blk, add, base, t)
	return len(c.pos) - before
}

// candSegments returns the candidate lists of n segments as segments.
func (sc *topkScratch) candSegments(n int) []segment {
	sc.cands = sc.cands[:0]
	for s := range n {
		sc.cands = append(sc.cands, segment{vals: sc.cand[s].vals, pos: sc.cand[s].pos})
	}
	return sc.cands
}

// collect fills sc.cands with, per input segment, its elements with key ≥ t
// in index order. It gives up and returns false once more than limit have
// been found in all.
func (sc *topkScratch) collect(input []segment, t uint32, limit int, run runner) bool {
	sc.resetCands(len(input))
	var found atomic.Int64
	run(len(input), 1, func(lo, hi int) {
		for s := lo; s < hi; s++ {
			vals := input[s].vals
			for from := 0; from < len(vals) && found.Load() <= int64(limit); from += collectBlock {
				blk, at := vals[from:min(from+collectBlock, len(vals))], input[s].base+from
				found.Add(int64(sc.collectInto(s, blk, sc.addendsOf(at, len(blk)), at, t)))
			}
		}
	})
	sc.candSegments(len(input))
	return found.Load() <= int64(limit)
}

// emit writes the selected elements, in index order, into body: every key
// above the threshold prefix and, segment by segment, the first need keys
// equal to it.
func (sel *selection) emit(body []byte, k int, run runner) {
	sc := sel.sc
	n := len(sel.segs)
	sc.off = resetInts(sc.off, n)
	sc.take = resetInts(sc.take, n)
	off, quota := 0, sel.need
	for s := range n {
		sc.take[s] = min(quota, sc.eq[s])
		quota -= sc.take[s]
		sc.off[s] = off
		off += sc.above[s] + sc.take[s]
	}
	idx, vals := body[:4*k], body[4*k:8*k]
	t := sel.prefix
	run(n, 1, func(lo, hi int) {
		for s := lo; s < hi; s++ {
			emitSegment(idx, vals, sc.off[s], &sel.segs[s], t, sc.take[s])
		}
	})
}

// emitSegment writes, from output slot o on, the elements of seg with key
// above t and the first take with key equal to t.
func emitSegment(idx, vals []byte, o int, seg *segment, t uint32, take int) {
	at := t // the least key still wanted
	if take == 0 {
		at = t + 1
	}
	x := seg.vals
	i := 0
	for end := misaligned(x); ; end = min(i+8, len(x)) {
		for ; i < end; i++ {
			u := magKey(x[i])
			if u < at {
				continue
			}
			if u == t {
				if take--; take == 0 {
					at = t + 1
				}
			}
			binary.LittleEndian.PutUint32(idx[4*o:], uint32(seg.index(i)))
			binary.LittleEndian.PutUint32(vals[4*o:], math.Float32bits(x[i]))
			o++
		}
		for t2 := lanes(at); i+8 <= len(x) && !groupAtLeast(&x[i], t2); {
			i += 8
		}
		if i == len(x) {
			return
		}
	}
}

// The sampled-threshold shortcut (DGC style). A fixed sample (sampleBlocks
// runs of sampleBlock consecutive elements, run j starting at ⌊j·n/
// sampleBlocks⌋) estimates the magnitude bound T above which slightly more
// than k elements lie: T is the r-th largest sample key with
// r = ⌈μ + 4√μ⌉ + 1, μ = sampleSize·k/n, i.e. four binomial standard
// deviations of margin, capped at the +Inf key. One pass over the input then
// collects every element with key ≥ T and exact selection runs on those
// candidates. If at least k were collected, they include every element of
// the exact top-k (the k-th largest key is ≥ T), so the result is the exact
// top-k: recall 1, the same bytes as the exact path. If fewer than k were
// collected, or more than collectFactor times the expected number (many
// ties at T, or a sample unlike the whole), the exact path runs instead.
// Non-finite inputs all have keys ≥ T, so they are among the candidates and
// the first is reported as the exact path would.
const (
	sampleBlocks  = 1024
	sampleBlock   = 64
	sampleSize    = sampleBlocks * sampleBlock
	sampledMinLen = 4 * sampleSize // below this the exact path runs
	sampledMaxInv = 8              // and for k > n/8, where sampling does not pay
	collectFactor = 3
)

// sampled runs the sampled-threshold shortcut. done reports whether it
// settled the call (with err, nil or a *NonFiniteError); if not, the caller
// runs the exact path.
func (sc *topkScratch) sampled(body []byte, src []float32, k int, run runner) (done bool, err error) {
	n := len(src)
	sc.sample = slices.Grow(sc.sample[:0], sampleSize)[:sampleSize]
	for j := range sampleBlocks {
		lo, smp := j*n/sampleBlocks, sc.sample[j*sampleBlock:(j+1)*sampleBlock]
		if sc.add.e != nil {
			addKernel(smp, sc.add.e[lo:], sc.add.g[lo:]) // the sums the pass below will write
		} else {
			copy(smp, src[lo:])
		}
	}
	mu := float64(sampleSize) * float64(k) / float64(n)
	r := min(int(math.Ceil(mu+4*math.Sqrt(mu)))+1, sampleSize)
	sel := sc.start([]segment{{vals: sc.sample}}, r, false)
	for l := range radixLevels {
		sel.histogram(l, serial)
		sel.pick(l)
	}
	t := min(sel.prefix, nonFiniteKey)
	limit := int(collectFactor * int64(r) * int64(n) / sampleSize)
	if !sc.collect(sc.input, t, limit, run) {
		return false, nil // the exact path sets what of the sum is still unset
	}
	sc.add = addends{} // the collection has written the whole sum
	found := 0
	for _, s := range sc.cands {
		found += len(s.vals)
	}
	if found < k {
		return false, nil
	}
	return true, sc.start(sc.cands, k, false).finish(body, k, 0, run)
}
