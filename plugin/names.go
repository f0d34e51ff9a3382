package main

import "C"

import (
	"fmt"

	"github.com/gradcomp/gradcomp/outer"
	"github.com/gradcomp/gradcomp/overlap"
)

// nameLists are the lists gc_name reads, by gc_name_list: overlap's and
// outer's own names of each enumeration, in value order, as C strings
// made once and kept for the process's lifetime.
var nameLists = [...][]*C.char{
	namesStrategy:  cNames(overlap.Strategies()),
	namesDecision:  cNames(overlap.Decisions()),
	namesOrigin:    cNames(overlap.Origins()),
	namesCaution:   cNames(overlap.Cautions()),
	namesGuard:     cNames(overlap.GuardStates()),
	namesOptimizer: cNames(outer.OptimizerKinds()),
}

// cNames returns the names of vs as C strings.
func cNames[T fmt.Stringer](vs []T) []*C.char {
	out := make([]*C.char, len(vs))
	for i, v := range vs {
		out[i] = C.CString(v.String())
	}
	return out
}

// gc_name only indexes nameLists, checking both indices: it has nothing
// to guard, and no status to report a failure with.
//
//export gc_name
func gc_name(list, i C.int) *C.char {
	if list < 0 || int(list) >= len(nameLists) || i < 0 || int(i) >= len(nameLists[list]) {
		return nil
	}
	return nameLists[list][i]
}
