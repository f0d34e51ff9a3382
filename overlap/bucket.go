package overlap

// DefaultBucketBytes is BucketSizes' default capacity, DDP's 25 MiB.
const DefaultBucketBytes = 25 << 20

// BucketSizes groups parameters into buckets the way DDP does: in reverse
// registration order (backward produces the last layers' gradients
// first), each bucket taking parameters until the next would push it past
// capBytes of float32s (capBytes ≤ 0 means DefaultBucketBytes). A
// parameter larger than capBytes gets a bucket of its own. It returns, per
// bucket, the parameter indices it holds (descending) and its element
// count. Sizes below zero count as zero; zero-size parameters join the
// current bucket.
func BucketSizes(paramSizes []int, capBytes int) (buckets [][]int, sizes []int) {
	if capBytes <= 0 {
		capBytes = DefaultBucketBytes
	}
	capElems := max(capBytes/4, 1)
	for p := len(paramSizes) - 1; p >= 0; p-- {
		n := max(paramSizes[p], 0)
		last := len(sizes) - 1
		if last < 0 || (sizes[last]+n > capElems && sizes[last] > 0) {
			buckets = append(buckets, nil)
			sizes = append(sizes, 0)
			last++
		}
		buckets[last] = append(buckets[last], p)
		sizes[last] += n
	}
	return buckets, sizes
}
