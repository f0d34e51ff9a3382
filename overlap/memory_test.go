package overlap

import (
	"context"
	"errors"
	"math"
	"runtime"
	"strings"
	"testing"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/compress"
)

// TestBufferBytes: each exchanger's bufferBytes is what its setup
// allocates.
func TestBufferBytes(t *testing.T) {
	for _, c := range []struct {
		spec     string
		strategy Strategy
		guard    float64
	}{{"topk:0.1", StrategySparseGather, 0}, {"int8", StrategyQuantSRA, 0}, {"int4", StrategyQuantAllGather, 0},
		{"randomk:0.2", StrategySharedIndex, 0}, {"randomk:0.2", StrategySharedIndex, 2}} {
		e := newEngines(t, 3, []int{1001}, Config{Spec: c.spec, Strategy: c.strategy, ErrorFeedback: true, Decision: DecideCompressed, Guard: c.guard})[1]
		b := e.buckets[0]
		got := len(b.send) + len(b.recv) + len(b.send2) + len(b.recv2) + 4*(len(b.mid)+len(b.vals)+cap(b.picks))
		if want := e.exchanger.bufferBytes(b.n); uint64(got) != want {
			t.Errorf("%s/%v (guard %v): setup allocated %d bytes, bufferBytes says %d", c.spec, c.strategy, c.guard, got, want)
		}
	}
}

// TestNewRefusesImpossibleMemory: buffers no machine has are a
// *MemoryError from New, before anything is allocated, on the rank that
// asked (wrapped in its *ConfigError), and a *ConfigError naming it on the
// others; the bookkeeping of the most buckets on the most ranks is too.
func TestNewRefusesImpossibleMemory(t *testing.T) {
	huge := make([]int, 256) // 16 TB of error feedback alone
	for i := range huge {
		huge[i] = int(min(compress.MaxElements, math.MaxInt))
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	errs := onRanks(group(t, 2), func(r int, c comm.Comm) error {
		sizes := []int{8}
		if r == 1 {
			sizes = huge
		}
		_, err := New(context.Background(), c, sizes, Config{Spec: "int8", ErrorFeedback: true, Decision: DecideCompressed})
		return err
	})
	runtime.ReadMemStats(&after)
	var me *MemoryError
	_, known := availableMemory()
	if !errors.As(errs[1], &me) || me.Need < 256*efBytesPerElement*(1<<32-1) || known != (me.Available > 0) {
		t.Errorf("rank 1: %v, want a *MemoryError against the machine's memory", errs[1])
	}
	var ce *ConfigError
	if !errors.As(errs[0], &ce) || ce.Rank != 1 || !strings.Contains(ce.Reason, "host buffers of 256 buckets on rank 1 need") {
		t.Errorf("rank 0: %v, want a *ConfigError naming rank 1's memory", errs[0])
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<28 {
		t.Errorf("New allocated %d bytes before refusing", grew)
	}
	if err := fits("bookkeeping", bookkeeping(math.MaxUint32, math.MaxUint16)); !errors.As(err, &me) {
		t.Errorf("the bookkeeping of 2³²−1 buckets on 65535 ranks: %v, want a *MemoryError", err)
	}
	t.Log(errs[1])
}
