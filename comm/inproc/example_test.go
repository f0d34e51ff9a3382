package inproc_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/inproc"
)

// Three ranks, one goroutine each, sum their gradients.
func Example() {
	ranks, err := inproc.NewGroup(3)
	if err != nil {
		panic(err)
	}
	sums := make([][]float32, len(ranks))
	var wg sync.WaitGroup
	for _, c := range ranks {
		wg.Add(1)
		go func(c comm.Comm) {
			defer wg.Done()
			defer c.Close()
			grad := []float32{float32(c.Rank()), 1, 0.5}
			if err := c.AllReduce(context.Background(), grad); err != nil {
				fmt.Println(err)
				return
			}
			sums[c.Rank()] = grad
		}(c)
	}
	wg.Wait()
	fmt.Println(sums)
	// Output: [[3 3 1.5] [3 3 1.5] [3 3 1.5]]
}
