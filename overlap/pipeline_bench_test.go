package overlap

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
)

// BenchmarkPipeline100MB is the CPU side of `gradcomp netbench` without the
// network: 4 in-process ranks (4 ranks on this 2-core machine, as the MPI
// run puts them), a 100 MB fp32 gradient cut into 25 MiB buckets, error
// feedback on, the compressed path pinned, one compressor goroutine per
// rank, and each codec's default strategy. Every bucket is made ready at
// once, as netbench does. Reported per step: the wall time, and rank 0's
// time in each stage summed over its buckets (stages of different buckets
// overlap), and the process's CPU time (user and system, all ranks), which
// a loaded machine disturbs less than the wall time. Profile one codec with
//
//	go test ./overlap -run '^$' -bench 'Pipeline100MB/topk' -benchtime 5x -cpuprofile cpu.out
func BenchmarkPipeline100MB(b *testing.B) {
	const ranks, size, bucket = 4, 25_000_000, 25 << 20 / 4
	var sizes []int
	for n := size; n > 0; n -= bucket {
		sizes = append(sizes, min(n, bucket))
	}
	grads := stepGrads(ranks, 0, sizes)
	for _, spec := range []string{"none", "topk:0.01", "int8", "int4", "randomk:0.01", "sign"} {
		// The engines outlive the sub-benchmark's runs (b.N = 1, then b.N),
		// so a profile holds their steady state. Two warm-up steps: the
		// first allocates the buffers, the second is the first to write the
		// error-feedback memory that Commit swaps in (fresh pages fault on
		// first touch, ~30 µs each on this machine).
		var engines []*Engine
		g := clone3(grads)
		b.Run(spec, func(b *testing.B) {
			if engines == nil {
				engines = make([]*Engine, ranks)
				errs := onRanks(group(b, ranks), func(r int, c comm.Comm) (err error) {
					engines[r], err = New(context.Background(), c, sizes,
						Config{Spec: spec, ErrorFeedback: true, Decision: DecideCompressed, Workers: 1})
					return err
				})
				mustNoErrors(b, "New", errs)
				for range 2 {
					benchStep(b, engines, g, 0)
				}
			}
			var compress, exchange, decompress, cpu time.Duration
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				for r := range g {
					for i := range g[r] {
						copy(g[r][i], grads[r][i])
					}
				}
				b.StartTimer()
				c0 := cpuTime(b)
				st := benchStep(b, engines, g, 0)
				cpu += cpuTime(b) - c0
				for _, bs := range st.Buckets {
					compress += bs.Compress
					exchange += bs.Exchange
					decompress += bs.Decompress
				}
			}
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 / float64(b.N) }
			b.ReportMetric(ms(cpu), "ms-cpu")
			b.ReportMetric(ms(compress), "ms-compress")
			b.ReportMetric(ms(exchange), "ms-exchange")
			b.ReportMetric(ms(decompress), "ms-decompress")
			b.SetBytes(4 * size)
		})
		for _, e := range engines {
			e.Close()
		}
	}
}

// cpuTime returns the CPU time the process has used so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
