package outer_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/gradcomp/gradcomp/comm/inproc"
	"github.com/gradcomp/gradcomp/outer"
	"github.com/gradcomp/gradcomp/overlap"
)

// Two in-process workers synchronize every 2 inner steps, averaging their
// models (outer optimizer None) with a dense exchange. Each worker's
// stand-in for an inner optimizer step adds its own amount to every
// weight: 1 on rank 0, 3 on rank 1. After 2 steps the local weights are
// 2 and 6, the pseudo-gradients −2 and −6, their average −4, and the
// global weights (and, with Alpha 0, both workers' local ones) become 4.
func Example() {
	comms, err := inproc.NewGroup(2)
	if err != nil {
		panic(err)
	}
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() {
			ctx := context.Background()
			params := [][]float32{make([]float32, 3)} // one tensor of 3 weights
			loop, err := outer.New(ctx, c, params, outer.Config{
				SyncEvery: 2,
				Optimizer: outer.Optimizer{Kind: outer.None},
				Engine:    overlap.Config{Spec: "none"},
			})
			if err != nil {
				panic(err)
			}
			defer loop.Close()
			for range 2 {
				for i := range params[0] { // the inner optimizer step
					params[0][i] += float32(2*r + 1)
				}
				report, err := loop.Step(ctx)
				if err != nil {
					panic(err)
				}
				if r == 0 {
					fmt.Printf("step %d: started %v, finished %d sync(s); global %v, local %v\n",
						report.Step, report.Started, len(report.Finished), loop.Global()[0], params[0])
				}
			}
		})
	}
	wg.Wait()
	// Output:
	// step 1: started [], finished 0 sync(s); global [0 0 0], local [1 1 1]
	// step 2: started [0], finished 1 sync(s); global [4 4 4], local [4 4 4]
}
