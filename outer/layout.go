package outer

import "github.com/gradcomp/gradcomp/overlap"

// segment is a run of one tensor's elements lying in one bucket of its
// fragment: tensor[at : at+n] is bucket[off : off+n].
type segment struct {
	tensor, at  int
	bucket, off int
	n           int
}

// layout is how a fragment's tensors lie in its engine's buckets.
type layout struct {
	sizes  []int             // elements per bucket
	segs   []segment         // in tensor order, then element order
	shapes [][]overlap.Shape // per bucket, its tensors' shapes (nil without Config.Shapes)
}

// layOut lays fragment f's tensors, in order, into buckets of at most
// BucketElements elements: each tensor joins the current bucket when it
// fits, else starts the next one; a larger tensor fills buckets of its own
// (split, unless Shapes are given: then it is one bucket, since PowerSGD
// needs whole matrices), its last piece starting the bucket later tensors
// join.
func layOut(s *settings, f int) layout {
	var l layout
	fill := 0 // elements in the current bucket, the last of l.sizes
	open := func() {
		l.sizes = append(l.sizes, 0)
		if s.Shapes != nil {
			l.shapes = append(l.shapes, nil)
		}
		fill = 0
	}
	for t, n := range s.sizes {
		if s.fragmentOf[t] != f || n == 0 { // empty tensors take no place
			continue
		}
		if len(l.sizes) == 0 || fill+n > s.BucketElements && fill > 0 {
			open()
		}
		piece := n
		if s.Shapes == nil {
			piece = min(n, s.BucketElements)
		}
		for at := 0; at < n; at += piece {
			if at > 0 {
				open()
			}
			m := min(piece, n-at)
			b := len(l.sizes) - 1
			l.segs = append(l.segs, segment{tensor: t, at: at, bucket: b, off: fill, n: m})
			fill += m
			l.sizes[b] = fill
		}
		if s.Shapes != nil {
			b := len(l.shapes) - 1
			l.shapes[b] = append(l.shapes[b], s.Shapes[t])
		}
	}
	return l
}
