package overlap

import (
	"fmt"
	"strings"
)

// The enumerations of this package (Strategy, Decision, Origin, Caution,
// GuardState) each have one list of names, indexed by value: String,
// the Parse function and the list of values (Strategies, ...) all read
// it, and the C ABI hands it out as it is (gc_name).

// enumString returns names[v], or "kind(v)" for a value past the list.
func enumString[T ~int](names []string, v T, kind string) string {
	if v >= 0 && int(v) < len(names) {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", kind, int(v))
}

// enumParse returns the value named s in names, or an error naming what
// (a kind of value) and every name.
func enumParse[T ~int](names []string, s, what string) (T, error) {
	for i, name := range names {
		if s == name {
			return T(i), nil
		}
	}
	return 0, fmt.Errorf("overlap: unknown %s %q (want one of %s)", what, s, strings.Join(names, ", "))
}

// enumValues returns the values that names name, in order.
func enumValues[T ~int](names []string) []T {
	out := make([]T, len(names))
	for i := range out {
		out[i] = T(i)
	}
	return out
}
