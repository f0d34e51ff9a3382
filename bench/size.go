package bench

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gradcomp/gradcomp/compress"
)

// ParseSize parses an element count written as a plain integer ("1000"), an
// integer with a binary suffix K, M or G (×2¹⁰, ×2²⁰, ×2³⁰, either case:
// "64M"), or a power of two ("2^20"). The count must be in [1,
// compress.MaxElements]; anything else is an error naming the input.
func ParseSize(s string) (int, error) {
	t := strings.TrimSpace(s)
	if base, exp, ok := strings.Cut(t, "^"); ok {
		if base != "2" {
			return 0, fmt.Errorf("bench: size %q: only powers of 2 may use ^", s)
		}
		e, err := strconv.ParseUint(exp, 10, 6)
		if err != nil {
			return 0, fmt.Errorf("bench: size %q: exponent %q is not an integer in [0, 63]", s, exp)
		}
		return checkSize(s, 1<<e)
	}
	shift := 0
	if t != "" {
		switch t[len(t)-1] {
		case 'k', 'K':
			shift = 10
		case 'm', 'M':
			shift = 20
		case 'g', 'G':
			shift = 30
		}
		if shift != 0 {
			t = t[:len(t)-1]
		}
	}
	v, err := strconv.ParseUint(t, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("bench: size %q is not a count like 1000, 64K, 16M or 2^20", s)
	}
	if v > compress.MaxElements>>shift {
		return 0, fmt.Errorf("bench: size %q exceeds %d elements", s, uint64(compress.MaxElements))
	}
	return checkSize(s, v<<shift)
}

func checkSize(s string, v uint64) (int, error) {
	if v < 1 || v > compress.MaxElements {
		return 0, fmt.Errorf("bench: size %q is %d elements, want 1 to %d", s, v, uint64(compress.MaxElements))
	}
	return int(v), nil
}

// ParseSizes parses a comma-separated list of sizes (see ParseSize), in order.
func ParseSizes(list string) ([]int, error) {
	var sizes []int
	for _, s := range strings.Split(list, ",") {
		n, err := ParseSize(s)
		if err != nil {
			return nil, err
		}
		sizes = append(sizes, n)
	}
	return sizes, nil
}

// FormatSize writes n the way ParseSize reads it, with the largest binary
// suffix that divides it exactly ("16M", "1536K", "1000").
func FormatSize(n int) string {
	for _, u := range []struct {
		shift  uint
		suffix string
	}{{30, "G"}, {20, "M"}, {10, "K"}} {
		if n != 0 && n%(1<<u.shift) == 0 {
			return strconv.Itoa(n>>u.shift) + u.suffix
		}
	}
	return strconv.Itoa(n)
}
