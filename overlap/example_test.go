package overlap_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/gradcomp/gradcomp/comm/inproc"
	"github.com/gradcomp/gradcomp/overlap"
)

// Two in-process ranks exchange two buckets with top-k 10% and error
// feedback. Rank r's first bucket holds r+1 everywhere; top-k keeps the
// first 100 elements (ties go to the lower index), so element 0 averages
// to 1.5.
func Example() {
	comms, err := inproc.NewGroup(2)
	if err != nil {
		panic(err)
	}
	sizes := []int{1000, 500}
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() {
			e, err := overlap.New(context.Background(), c, sizes,
				overlap.Config{Spec: "topk:0.1", ErrorFeedback: true, Decision: overlap.DecideCompressed})
			if err != nil {
				panic(err)
			}
			defer e.Close()
			grads := [][]float32{make([]float32, 1000), make([]float32, 500)}
			for i := range grads[0] {
				grads[0][i] = float32(r + 1)
			}
			if err := e.Step(); err != nil {
				panic(err)
			}
			for i, g := range grads { // as backward produces each bucket
				if err := e.Ready(i, g); err != nil {
					panic(err)
				}
			}
			stats, err := e.Wait(context.Background())
			if err != nil {
				panic(err)
			}
			if r == 0 {
				fmt.Println(stats.Buckets[0].Strategy, stats.Buckets[0].Compressed, grads[0][0], grads[0][999])
			}
		})
	}
	wg.Wait()
	// Output: sparse-gather true 1.5 0
}
