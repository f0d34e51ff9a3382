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

// useWorkers applies a caller's workers to the runtime's cap.
func useWorkers(workers int) {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	procs.Lock()
	defer procs.Unlock()
	switch {
	case procs.lifted:
		return
	case workers <= 0:
		procs.lifted = true
		runtime.GOMAXPROCS(procs.initial)
	case workers > procs.asked:
		procs.asked = workers
		runtime.GOMAXPROCS(min(workers, procs.initial))
	}
}
