// Package commtest is the conformance suite of comm.Comm: every
// implementation's tests call Run on every rank of a group, whether the ranks
// are goroutines (comm/inproc) or processes (comm/mpi).
//
// Each rank derives every rank's inputs from (rank, length, element index),
// so it can compute the expected result of each collective on its own and
// compare it with what it received. Float sums are checked against the
// serial loop the comm package documents:
//
//	want[i] = float32(…(float32(x₀[i] + x₁[i]) + x₂[i]) + …)
package commtest

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"

	"github.com/gradcomp/gradcomp/comm"
)

// Lengths are the per-rank element counts (chunk lengths for AllToAll and
// ReduceScatter) Run exercises: empty, one, odd, around a power of two, and
// a few pages' worth.
var Lengths = []int{0, 1, 2, 3, 7, 8, 9, 1023, 4099}

// Options says which guarantees of the comm package the implementation under
// test makes.
type Options struct {
	// RankOrder: AllReduce and ReduceScatter add in rank order, so sums of
	// arbitrary values must equal the serial loop bit for bit. Without it,
	// sums of small integers (exact in any order) must still be exact, and
	// sums of arbitrary values must be within the bound of Size()-1
	// roundings, |got − want| ≤ (Size()−1)·2⁻²³·Σᵣ|xᵣ[i]|, twice the
	// standard first-order bound (n−1)·u·Σ|x| with u = 2⁻²⁴.
	RankOrder bool
}

// Run runs every collective on c over Lengths and returns the first
// discrepancy it finds, naming the collective, length, rank and element. It
// is collective: call it on every rank of the group at once with the same
// Options. Besides each rank's own result it checks, with AllGather, that
// every rank ended with bit-identical sums, and that a repeated AllReduce
// gives the same bits.
func Run(ctx context.Context, c comm.Comm, o Options) error {
	for _, l := range Lengths {
		for _, step := range []func(context.Context, comm.Comm, Options, int) error{
			allGather, allToAll, broadcast, allReduce, reduceScatter, barrier,
		} {
			if err := step(ctx, c, o, l); err != nil {
				return err
			}
		}
	}
	return nil
}

// Input kinds: the seeds that tell inputs of different tests apart.
const (
	kindGather uint64 = iota + 1
	kindAllToAll
	kindBroadcast
	kindInts
	kindFloats
	kindGarbage
)

// mix is SplitMix64's finalizer.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// word returns the pseudo-random word for element i of the input (kind,
// rank, tag) of length l.
func word(kind uint64, rank, tag, l, i int) uint64 {
	return mix(mix(mix(mix(kind)^uint64(rank))^uint64(tag))^uint64(l)) ^ mix(uint64(i))
}

func bytesOf(kind uint64, rank, tag, l int) []byte {
	b := make([]byte, l)
	for i := range b {
		b[i] = byte(word(kind, rank, tag, l, i))
	}
	return b
}

// floatsOf returns rank's float input of length l: integers in [-1000, 1000]
// for kindInts, else values of both signs spanning 2⁻⁸ to 2⁸ in magnitude.
func floatsOf(kind uint64, rank, l int) []float32 {
	x := make([]float32, l)
	for i := range x {
		w := word(kind, rank, 0, l, i)
		if kind == kindInts {
			x[i] = float32(int(w%2001) - 1000)
			continue
		}
		mant := float32(w>>40)/(1<<24)*2 - 1 // in [-1, 1)
		x[i] = float32(math.Ldexp(float64(mant), int(w%17)-8))
	}
	return x
}

// guarded returns a slice of length l whose backing array continues with
// guard bytes, filled with garbage so a call that skips an element shows.
func guarded(l int) []byte {
	b := bytesOf(kindGarbage, 0, 0, l+guardLen)
	return b[:l]
}

const guardLen = 16

// checkGuard reports an overrun past len(b) into its guard bytes.
func checkGuard(op comm.Op, rank int, b []byte) error {
	l := len(b)
	want := bytesOf(kindGarbage, 0, 0, l+guardLen)[l:]
	if got := b[l : l+guardLen]; string(got) != string(want) {
		return fmt.Errorf("%v, %d bytes, rank %d: wrote past the end of dst", op, l, rank)
	}
	return nil
}

func diffBytes(op comm.Op, what string, rank int, got, want []byte) error {
	for i := range want {
		if got[i] != want[i] {
			return fmt.Errorf("%v, %s, rank %d: byte %d is %#02x, want %#02x", op, what, rank, i, got[i], want[i])
		}
	}
	return nil
}

func allGather(ctx context.Context, c comm.Comm, _ Options, l int) error {
	n, r := c.Size(), c.Rank()
	src := bytesOf(kindGather, r, 0, l)
	dst := guarded(n * l)
	if err := c.AllGather(ctx, dst, src); err != nil {
		return err
	}
	want := make([]byte, 0, n*l)
	for q := range n {
		want = append(want, bytesOf(kindGather, q, 0, l)...)
	}
	if err := diffBytes(comm.OpAllGather, fmt.Sprintf("len(src) %d", l), r, dst, want); err != nil {
		return err
	}
	if err := diffBytes(comm.OpAllGather, "src after the call", r, src, bytesOf(kindGather, r, 0, l)); err != nil {
		return err
	}
	return checkGuard(comm.OpAllGather, r, dst)
}

func allToAll(ctx context.Context, c comm.Comm, _ Options, m int) error {
	n, r := c.Size(), c.Rank()
	src := make([]byte, 0, n*m)
	want := make([]byte, 0, n*m)
	for q := range n {
		src = append(src, bytesOf(kindAllToAll, r, q, m)...)   // from r to q
		want = append(want, bytesOf(kindAllToAll, q, r, m)...) // from q to r
	}
	dst := guarded(n * m)
	if err := c.AllToAll(ctx, dst, src); err != nil {
		return err
	}
	if err := diffBytes(comm.OpAllToAll, fmt.Sprintf("chunk %d", m), r, dst, want); err != nil {
		return err
	}
	return checkGuard(comm.OpAllToAll, r, dst)
}

func broadcast(ctx context.Context, c comm.Comm, _ Options, l int) error {
	n, r := c.Size(), c.Rank()
	for root := range n {
		want := bytesOf(kindBroadcast, root, 0, l)
		buf := guarded(l)
		if r == root {
			copy(buf, want)
		}
		if err := c.Broadcast(ctx, buf, root); err != nil {
			return err
		}
		if err := diffBytes(comm.OpBroadcast, fmt.Sprintf("len %d, root %d", l, root), r, buf, want); err != nil {
			return err
		}
		if err := checkGuard(comm.OpBroadcast, r, buf); err != nil {
			return err
		}
	}
	return nil
}

func barrier(ctx context.Context, c comm.Comm, _ Options, _ int) error {
	return c.Barrier(ctx)
}

// sums returns the serial rank-order float32 sum of every rank's input of
// length l, and the sum of their magnitudes (for the error bound).
func sums(kind uint64, n, l int) (want []float32, abs []float64) {
	want = make([]float32, l)
	abs = make([]float64, l)
	for q := range n {
		for i, v := range floatsOf(kind, q, l) {
			if q == 0 {
				want[i] = v
			} else {
				want[i] += v
			}
			abs[i] += math.Abs(float64(v))
		}
	}
	return want, abs
}

// checkSum compares got with the serial sum want of inputs whose magnitudes
// add to abs, as o and kind demand.
func checkSum(op comm.Op, kind uint64, o Options, n, rank, offset int, got, want []float32, abs []float64) error {
	for i, g := range got {
		w := want[offset+i]
		if math.Float32bits(g) == math.Float32bits(w) {
			continue
		}
		if !o.RankOrder && kind == kindFloats &&
			math.Abs(float64(g)-float64(w)) <= float64(n-1)*0x1p-23*abs[offset+i] {
			continue
		}
		return fmt.Errorf("%v, length %d, rank %d, %s input: element %d is %v (%#08x), want %v (%#08x)",
			op, len(want), rank, kindName(kind), offset+i, g, math.Float32bits(g), w, math.Float32bits(w))
	}
	return nil
}

func kindName(kind uint64) string {
	if kind == kindInts {
		return "integer"
	}
	return "arbitrary"
}

// sameEverywhere checks that every rank holds the same bits in x, by an
// AllGather of a hash of x.
func sameEverywhere(ctx context.Context, c comm.Comm, op comm.Op, x []float32) error {
	h := fnv.New64a()
	for _, v := range x {
		b := math.Float32bits(v)
		h.Write([]byte{byte(b), byte(b >> 8), byte(b >> 16), byte(b >> 24)})
	}
	mine := h.Sum(nil)
	all := make([]byte, len(mine)*c.Size())
	if err := c.AllGather(ctx, all, mine); err != nil {
		return err
	}
	for q := range c.Size() {
		if string(all[q*len(mine):(q+1)*len(mine)]) != string(all[:len(mine)]) {
			return fmt.Errorf("%v, length %d: rank %d's result differs from rank 0's", op, len(x), q)
		}
	}
	return nil
}

func allReduce(ctx context.Context, c comm.Comm, o Options, l int) error {
	n, r := c.Size(), c.Rank()
	for _, kind := range []uint64{kindInts, kindFloats} {
		want, abs := sums(kind, n, l)
		var first []float32
		for rep := range 2 {
			buf := floatsOf(kind, r, l)
			if err := c.AllReduce(ctx, buf); err != nil {
				return err
			}
			if err := checkSum(comm.OpAllReduce, kind, o, n, r, 0, buf, want, abs); err != nil {
				return err
			}
			if rep == 0 {
				first = buf
				continue
			}
			for i := range buf {
				if math.Float32bits(buf[i]) != math.Float32bits(first[i]) {
					return fmt.Errorf("AllReduce, length %d, rank %d: element %d is %v on one run, %v on the next", l, r, i, first[i], buf[i])
				}
			}
		}
		if err := sameEverywhere(ctx, c, comm.OpAllReduce, first); err != nil {
			return err
		}
	}
	return nil
}

func reduceScatter(ctx context.Context, c comm.Comm, o Options, m int) error {
	n, r := c.Size(), c.Rank()
	for _, kind := range []uint64{kindInts, kindFloats} {
		want, abs := sums(kind, n, n*m)
		src := floatsOf(kind, r, n*m)
		dst := floatsOf(kindGarbage, r, m)
		if err := c.ReduceScatter(ctx, dst, src); err != nil {
			return err
		}
		if err := checkSum(comm.OpReduceScatter, kind, o, n, r, r*m, dst, want, abs); err != nil {
			return err
		}
	}
	return nil
}
