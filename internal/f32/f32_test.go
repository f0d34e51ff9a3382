package f32

import (
	"math"
	"testing"
)

func TestViews(t *testing.T) {
	x := []float32{1, -2.5, float32(math.Inf(1))}
	b := Bytes(x)
	if len(b) != 12 {
		t.Fatalf("Bytes: %d bytes, want 12", len(b))
	}
	y := Floats(b)
	y[1] = 7 // a view, not a copy
	if len(y) != 3 || x[1] != 7 || y[2] != x[2] {
		t.Errorf("Floats(Bytes(x)) = %v, x = %v", y, x)
	}
	if Bytes(nil) != nil || Floats([]byte{1, 2, 3}) != nil {
		t.Error("empty views are not nil")
	}
}
