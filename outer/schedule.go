package outer

import "math/bits"

// The schedule (the package doc states it for users). Inner steps count
// s = 1, 2, …; fragment f of F starts its sync at the steps s ≥ off_f with
// (s − off_f) mod H = 0, off_f = ⌊(f+1)·H/F⌋, and finishes it at s + τ.
//
// At most one exchange is in flight at a time: the start steps of all
// fragments, in order, are off_0 < off_1 < … < off_{F−1} = H < off_0 + H
// < …, consecutive ones at least ⌊H/F⌋ apart (⌊(f+2)H/F⌋ − ⌊(f+1)H/F⌋ ≥
// ⌊H/F⌋, and off_0 + H − off_{F−1} = ⌊H/F⌋), and τ·F < H gives τ ≤
// ⌊H/F⌋. So each exchange finishes at or before the next one starts, and
// Step finishes exchanges before it starts any: the fragment engines'
// collectives, which run only between an engine's Step and its Wait,
// never meet on the Comm they share. (When F > H, τ is 0 and several
// fragments may start at one step: each is started and finished before
// the next starts.)

// offset is off_f, fragment f's first sync step (for F > H it may be 0,
// which is never a step: the first sync is then at H).
func (s *settings) offset(f int) uint64 {
	hi, lo := bits.Mul64(uint64(f+1), uint64(s.SyncEvery)) // f+1 ≤ F, so hi < F
	off, _ := bits.Div64(hi, lo, uint64(s.Fragments))
	return off
}

// startsAt reports whether fragment f starts a sync at inner step step.
func (s *settings) startsAt(f int, step uint64) bool {
	off := s.offset(f)
	return step >= off && (step-off)%uint64(s.SyncEvery) == 0
}

// inFlight returns the step at which fragment f's sync in flight after
// inner step step started (one started at s0 with s0 ≤ step < s0 + τ), or
// 0 for none.
func (s *settings) inFlight(f int, step uint64) uint64 {
	for back := range uint64(s.Delay) {
		if back < step && s.startsAt(f, step-back) {
			return step - back
		}
	}
	return 0
}
