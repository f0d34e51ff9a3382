package compress

import "sync"

// runner runs a data-parallel loop: run(n, grain, fn) calls fn on disjoint
// chunks [lo, hi) covering [0, n), each boundary a multiple of grain (so a
// chunk never splits a quantization bucket or a packed byte). fn calls may
// run concurrently; runner returns when all have returned.
type runner func(n, grain int, fn func(lo, hi int))

// runner returns the loop runner for a call over n elements: serial below the
// parallel threshold or with one worker, else up to opts.workers goroutines.
func (c *compressor) runner(n int) runner {
	if c.opts.workers <= 1 || n < c.opts.minParallel {
		return serial
	}
	workers := c.opts.workers
	return func(n, grain int, fn func(lo, hi int)) { parallel(n, grain, workers, fn) }
}

// serial is the single-goroutine runner.
func serial(n, _ int, fn func(lo, hi int)) {
	if n > 0 {
		fn(0, n)
	}
}

func parallel(n, grain, workers int, fn func(lo, hi int)) {
	if grain < 1 {
		grain = 1
	}
	units := (n + grain - 1) / grain
	if workers > units {
		workers = units
	}
	if workers <= 1 {
		serial(n, grain, fn)
		return
	}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		lo := units * w / workers * grain
		hi := min(units*(w+1)/workers*grain, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(lo, hi)
		}()
	}
	wg.Wait()
}

// firstError collects per-chunk errors from a runner and keeps the one for
// the lowest chunk, so parallel and serial runs report the same error.
type firstError struct {
	mu  sync.Mutex
	lo  int
	err error
}

// set records err for the chunk starting at lo.
func (f *firstError) set(lo int, err error) {
	if err == nil {
		return
	}
	f.mu.Lock()
	if f.err == nil || lo < f.lo {
		f.lo, f.err = lo, err
	}
	f.mu.Unlock()
}
