package main

import (
	"os"
	"runtime"
	"testing"
)

// TestUseWorkers: workers > 0 caps the runtime at the largest count asked
// (never above its own GOMAXPROCS), a smaller one later does not lower
// it, workers ≤ 0 lifts the cap for good; GOMAXPROCS in the environment
// leaves the runtime alone.
func TestUseWorkers(t *testing.T) {
	if os.Getenv("GOMAXPROCS") != "" {
		t.Skip("GOMAXPROCS is set in the environment: the library leaves the runtime alone")
	}
	procs.Lock()
	saved := struct {
		asked  int
		lifted bool
	}{procs.asked, procs.lifted}
	procs.asked, procs.lifted = 0, false
	procs.Unlock()
	before := runtime.GOMAXPROCS(0)
	t.Cleanup(func() {
		procs.Lock()
		procs.asked, procs.lifted = saved.asked, saved.lifted
		procs.Unlock()
		runtime.GOMAXPROCS(before)
	})
	for _, s := range []struct {
		workers, want int
	}{
		{1, 1}, {1, 1}, {2, min(2, procs.initial)}, {1, min(2, procs.initial)},
		{1 << 20, procs.initial}, {0, procs.initial}, {1, procs.initial},
	} {
		useWorkers(s.workers)
		if got := runtime.GOMAXPROCS(0); got != s.want {
			t.Fatalf("after workers %d: GOMAXPROCS %d, want %d", s.workers, got, s.want)
		}
	}
	if !procs.lifted {
		t.Error("workers 0 did not lift the cap")
	}
}

// TestUseWorkersUndo: a creation that failed leaves the cap as it was,
// through newCompressor's bad spec too.
func TestUseWorkersUndo(t *testing.T) {
	if os.Getenv("GOMAXPROCS") != "" {
		t.Skip("GOMAXPROCS is set in the environment: the library leaves the runtime alone")
	}
	procs.Lock()
	asked, lifted := procs.asked, procs.lifted
	procs.asked, procs.lifted = 0, false
	procs.Unlock()
	before := runtime.GOMAXPROCS(0)
	t.Cleanup(func() {
		procs.Lock()
		procs.asked, procs.lifted = asked, lifted
		procs.Unlock()
		runtime.GOMAXPROCS(before)
	})
	useWorkers(1)
	if _, err := newCompressor("topk:7", 0); err == nil {
		t.Fatal("newCompressor(topk:7) made a compressor")
	}
	if got := runtime.GOMAXPROCS(0); got != 1 || procs.lifted || procs.asked != 1 {
		t.Errorf("after a failed create with workers 0: GOMAXPROCS %d, lifted %v, asked %d; want 1, false, 1", got, procs.lifted, procs.asked)
	}
	undo := useWorkers(min(2, procs.initial))
	undo()
	if got := runtime.GOMAXPROCS(0); got != 1 || procs.asked != 1 {
		t.Errorf("after undo: GOMAXPROCS %d, asked %d; want 1, 1", got, procs.asked)
	}
}
