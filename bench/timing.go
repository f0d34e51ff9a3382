package bench

import (
	"sync"
	"time"
)

// minSample is the shortest stretch of time one sample measures: an operation
// faster than that is repeated within the sample, so the clock's resolution
// and the loop overhead stay small against it.
const minSample = time.Millisecond

// maxIters bounds the repetitions within one sample.
const maxIters = 1 << 20

// stopwatch times one operation and keeps its best (shortest) time per call
// over the samples taken.
type stopwatch struct {
	op    func() error
	iters int           // calls per sample, set by calibrate
	best  time.Duration // shortest time per call seen by sample
}

// newStopwatch returns a stopwatch for op with no sample taken yet.
func newStopwatch(op func() error) *stopwatch {
	return &stopwatch{op: op, iters: 1, best: time.Duration(1<<63 - 1)}
}

// calibrate times one call of op and sets how many calls a sample makes so
// that it lasts at least minSample. The call is not counted as a sample.
func (s *stopwatch) calibrate() error {
	t, err := s.run(1)
	if err != nil {
		return err
	}
	s.iters = int(min(max(int64(minSample/max(t, 1)), 1), maxIters))
	return nil
}

// sample times s.iters calls of op and keeps the time per call if it is the
// best so far.
func (s *stopwatch) sample() error {
	t, err := s.run(s.iters)
	if err != nil {
		return err
	}
	s.best = min(s.best, t/time.Duration(s.iters))
	return nil
}

func (s *stopwatch) run(iters int) (time.Duration, error) {
	start := time.Now()
	for range iters {
		if err := s.op(); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

// gbps converts a time for moving n bytes into 10⁹ bytes per second.
func gbps(n int, t time.Duration) float64 {
	return float64(n) / t.Seconds() / 1e9
}

// copyGrain is the smallest chunk parallelCopy hands to a goroutine.
const copyGrain = 1 << 16

// parallelCopy is copy(dst, src) split over up to workers goroutines, the
// memcpy baseline matching a codec allowed the same number of workers.
func parallelCopy(dst, src []float32, workers int) {
	n := min(len(dst), len(src))
	workers = min(workers, n/copyGrain)
	if workers <= 1 {
		copy(dst, src)
		return
	}
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := n*w/workers, n*(w+1)/workers
		wg.Add(1)
		go func() {
			defer wg.Done()
			copy(dst[lo:hi], src[lo:hi])
		}()
	}
	wg.Wait()
}
