package lowrank_test

import (
	"fmt"

	"github.com/gradcomp/gradcomp/compress/lowrank"
)

// One PowerSGD round at rank 1 on one worker, for a 3×4 matrix of rank 1:
// the approximation is the matrix, the residual zero.
func Example() {
	const rows, cols, r = 3, 4, 1
	m := []float32{
		1, 2, 3, 4,
		2, 4, 6, 8,
		-1, -2, -3, -4,
	}
	q := []float32{1, 1, 1, 1} // the warm start (random at the first round)
	p := make([]float32, rows*r)
	lowrank.MulQ(p, m, rows, cols, q, r) // then all-reduce p
	zeroed := lowrank.Orthogonalize(p, rows, r)
	lowrank.MulTP(q, m, rows, cols, p, r) // then all-reduce q into qAvg
	out := make([]float32, rows*cols)
	lowrank.Decompose(out, m, m, rows, cols, p, q, q, r, 1) // the residual replaces m
	fmt.Println("zeroed:", zeroed)
	fmt.Printf("p̂: %.4f\n", p)
	fmt.Printf("out: %.3f\n", out)
	var worst float32
	for _, v := range m {
		worst = max(worst, v, -v)
	}
	fmt.Println("residual below 1e-6:", worst < 1e-6)
	// Output:
	// zeroed: 0
	// p̂: [0.4082 0.8165 -0.4082]
	// out: [1.000 2.000 3.000 4.000 2.000 4.000 6.000 8.000 -1.000 -2.000 -3.000 -4.000]
	// residual below 1e-6: true
}
