package gputest

import (
	"errors"
	"fmt"
	"testing"
)

var errAbsent = errors.New("no device")

func TestOpenerOpensOnce(t *testing.T) {
	calls := 0
	get := Opener(func() (int, error) { calls++; return 42, nil }, errAbsent)
	for range 3 {
		if v := get(t); v != 42 {
			t.Fatalf("got %d", v)
		}
	}
	if calls != 1 {
		t.Errorf("open ran %d times, want once", calls)
	}
}

func TestOpenerSkipsWhenAbsent(t *testing.T) {
	get := Opener(func() (int, error) { return 0, fmt.Errorf("open: %w", errAbsent) }, errAbsent)
	ran := false
	t.Run("inner", func(t *testing.T) {
		defer func() { ran = t.Skipped() }()
		get(t)
		t.Error("not skipped")
	})
	if !ran {
		t.Error("a missing device did not skip the test")
	}
}
