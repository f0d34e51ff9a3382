package compress_test

import (
	"fmt"

	"github.com/gradcomp/gradcomp/compress"
)

func ExampleParse() {
	c, err := compress.Parse("fp16:lossless=none")
	if err != nil {
		panic(err)
	}
	fmt.Println(c.Spec(), c.Codec(), c.MaxEncodedLen(1000))

	_, err = compress.Parse("fp16:0.5")
	fmt.Println(err)
	// Output:
	// fp16 fp16 2060
	// compress: bad spec "fp16:0.5": unexpected argument "0.5" for fp16
}

func ExampleCompressor() {
	c, err := compress.Parse("fp16")
	if err != nil {
		panic(err)
	}
	grad := []float32{0.1, -2.5, 1000.3, 3e-6}
	payload, err := c.Compress(nil, grad, compress.Key{Bucket: 0, Step: 1})
	if err != nil {
		panic(err)
	}
	fmt.Println(len(payload), "bytes")

	got := make([]float32, len(grad))
	if err := c.Decompress(got, payload); err != nil {
		panic(err)
	}
	fmt.Println(got)

	// DecompressAdd accumulates, as a reduction over ranks does.
	if err := c.DecompressAdd(got, payload); err != nil {
		panic(err)
	}
	fmt.Println(got)
	// Output:
	// 68 bytes
	// [0.099975586 -2.5 1000.5 2.9802322e-06]
	// [0.19995117 -5 2001 5.9604645e-06]
}

func ExampleErrorFeedback() {
	c, err := compress.Parse("fp16")
	if err != nil {
		panic(err)
	}
	f := compress.NewErrorFeedback(c)
	grad := []float32{0.1, 1000.3}
	for step := range uint64(3) {
		if _, err := f.Compress(nil, grad, compress.Key{Bucket: 7, Step: step}); err != nil {
			panic(err)
		}
		// What fp16 dropped is carried into the next step.
		fmt.Println(f.Residual(7))
	}
	// Output:
	// [2.4415553e-05 -0.2000122]
	// [-1.2204051e-05 0.099975586]
	// [1.2211502e-05 -0.10003662]
}
