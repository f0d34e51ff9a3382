package main

import (
	"os"
	"runtime"
	"sync"
)

// The library's Go runtime runs on at most the threads its callers ask
// for. A compressor or engine created with workers > 0 caps the runtime
// at the largest such count asked so far (runtime.GOMAXPROCS); one
// created with workers ≤ 0 (all CPUs) lifts the cap for good. Without
// the cap every process of a host runs as many Go threads as the host
// has CPUs: with several ranks per host (DDP's processes) they contend
// for the cores the framework's own threads need (torchbench, 4 ranks on
// 2 cores, a bucket sent dense: 1.19× torch's default step uncapped,
// 1.12× with workers=1). A GOMAXPROCS set in the environment wins.
var procs = struct {
	sync.Mutex
	initial int  // the runtime's own GOMAXPROCS (the CPUs it may use), the most the cap allows
	asked   int  // the largest positive workers asked so far
	lifted  bool // a caller asked for all CPUs
}{initial: runtime.GOMAXPROCS(0)}

// useWorkers applies a caller's workers to the runtime's cap, before the
// compressor or engine is made (a compressor's default worker count is
// the runtime's), and returns the function that undoes it, for a
// creation that failed: bad input leaves the cap as it was.
func useWorkers(workers int) (undo func()) {
	if os.Getenv("GOMAXPROCS") != "" {
		return func() {}
	}
	procs.Lock()
	defer procs.Unlock()
	asked, lifted, was := procs.asked, procs.lifted, runtime.GOMAXPROCS(0)
	switch {
	case procs.lifted:
		return func() {}
	case workers <= 0:
		procs.lifted = true
		runtime.GOMAXPROCS(procs.initial)
	case workers > procs.asked:
		procs.asked = workers
		runtime.GOMAXPROCS(min(workers, procs.initial))
	}
	return func() {
		procs.Lock()
		defer procs.Unlock()
		procs.asked, procs.lifted = asked, lifted
		runtime.GOMAXPROCS(was)
	}
}
