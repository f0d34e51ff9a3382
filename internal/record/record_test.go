package record

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm/inproc"
)

func TestEncodeDecode(t *testing.T) {
	fs := []Field{{Name: "spec", Value: "int8"}, {Name: "", Value: ""}, {Name: "bucket 0 elements", Value: "4096"}}
	got, err := Decode(Encode(fs))
	if err != nil || len(got) != len(fs) {
		t.Fatalf("Decode(Encode(%v)) = %v, %v", fs, got, err)
	}
	for i := range fs {
		if got[i] != fs[i] {
			t.Errorf("field %d: %v, want %v", i, got[i], fs[i])
		}
	}
	b := Encode(fs)
	for cut := 1; cut < len(b); cut++ {
		if got, err := Decode(b[:cut]); err != nil && !errors.Is(err, ErrTruncated) {
			t.Errorf("Decode of %d of %d bytes: %v, want ErrTruncated or a shorter record", cut, len(b), err)
		} else if err == nil && len(got) >= len(fs) {
			t.Errorf("Decode of %d of %d bytes read every field", cut, len(b))
		}
	}
}

func TestFirstDifference(t *testing.T) {
	a := []Field{{Name: "x", Value: "1"}, {Name: "y", Value: "2"}}
	if _, _, differ := FirstDifference(a, a); differ {
		t.Error("a record differs from itself")
	}
	g, w, differ := FirstDifference(a, []Field{{Name: "x", Value: "1"}, {Name: "y", Value: "3"}})
	if !differ || g != a[1] || w != (Field{Name: "y", Value: "3"}) {
		t.Errorf("FirstDifference = %v, %v, %v; want y 2 against y 3", g, w, differ)
	}
	g, w, differ = FirstDifference(a[:1], a)
	if !differ || g != (Field{}) || w != a[1] {
		t.Errorf("FirstDifference of a shorter record = %v, %v, %v; want the zero Field against y", g, w, differ)
	}
}

func TestGather(t *testing.T) {
	comms, err := inproc.NewGroup(3)
	if err != nil {
		t.Fatal(err)
	}
	recs := make([][][]Field, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := []Field{{Name: "rank", Value: strings.Repeat("r", r+1)}} // of different lengths
			recs[r], errs[r] = Gather(context.Background(), c, 5*time.Second, "test", mine)
		}()
	}
	wg.Wait()
	for r := range comms {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		for from, fs := range recs[r] {
			if len(fs) != 1 || fs[0].Value != strings.Repeat("r", from+1) {
				t.Errorf("rank %d got rank %d's record as %v", r, from, fs)
			}
		}
	}
}
