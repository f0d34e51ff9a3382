package netbench

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/gradcomp/gradcomp/comm"
)

// Probe measures the rate of each rank's link in Gbit/s (10⁹ bits/s) with
// an all-to-all of n bytes per rank, n a positive multiple of c.Size(): in
// it every rank sends (Size−1)/Size·n bytes and receives as many, so on a
// switched network whose ports are the bottleneck the rate is
// 8·(Size−1)/Size·n / t, with t the slowest rank's time. It returns the
// median over reps timed runs after one warm-up; each collective is bounded
// by timeout. With one rank nothing crosses a link and the rate is 0.
func Probe(ctx context.Context, c comm.Comm, n, reps int, timeout time.Duration) (float64, error) {
	if n <= 0 || n%c.Size() != 0 || reps < 1 {
		return 0, fmt.Errorf("netbench: probe of %d bytes and %d runs on %d ranks: want a positive multiple of the rank count and at least one run", n, reps, c.Size())
	}
	if c.Size() == 1 {
		return 0, nil
	}
	src, dst := make([]byte, n), make([]byte, n)
	for i := range src {
		src[i] = byte(i)
	}
	var rates []float64
	for rep := -1; rep < reps; rep++ {
		if err := barrier(ctx, c, timeout); err != nil {
			return 0, err
		}
		start := time.Now()
		err := withTimeout(ctx, timeout, func(ctx context.Context) error { return c.AllToAll(ctx, dst, src) })
		took := time.Since(start)
		if err != nil {
			return 0, err
		}
		all, err := gatherFloats(ctx, c, timeout, []float64{took.Seconds()})
		if err != nil {
			return 0, err
		}
		if rep >= 0 {
			sent := float64(c.Size()-1) / float64(c.Size()) * float64(n)
			rates = append(rates, 8*sent/max(slices.Max(all), 1e-9)/1e9)
		}
	}
	return median(rates), nil
}
