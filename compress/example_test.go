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

	// Defaults are dropped from the canonical spec.
	q, err := compress.Parse("int8:bucket=512:round=nearest")
	if err != nil {
		panic(err)
	}
	fmt.Println(q.Spec(), q.Codec(), q.MaxEncodedLen(1000))

	_, err = compress.Parse("fp16:0.5")
	fmt.Println(err)
	// Output:
	// fp16 fp16 2060
	// int8:round=nearest int8 1076
	// compress: bad spec "fp16:0.5": unexpected argument "0.5" for fp16
}

// A quantizing codec: each bucket of 512 elements is sent as its minimum and
// scale plus one byte per element, so every value comes back within half a
// step, (max − min)/255/2, of where it was.
func ExampleCompressor_quantized() {
	c, err := compress.Parse("int8:round=nearest")
	if err != nil {
		panic(err)
	}
	grad := []float32{-1, -0.3, 0, 0.01, 0.5, 1}
	payload, err := c.Compress(nil, grad, compress.Key{Bucket: 2, Step: 10})
	if err != nil {
		panic(err)
	}
	got := make([]float32, len(grad))
	if err := c.Decompress(got, payload); err != nil {
		panic(err)
	}
	fmt.Println(len(payload), "bytes")
	fmt.Println(got)
	// Output:
	// 74 bytes
	// [-1 -0.30196077 0.003921628 0.011764765 0.49803925 1]
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
