package bench

import (
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	cases := []struct {
		in      string
		want    int
		wantErr string // substring of the error; "" for success
	}{
		{"1000", 1000, ""},
		{"1", 1, ""},
		{" 64K ", 64 << 10, ""},
		{"64k", 64 << 10, ""},
		{"1M", 1 << 20, ""},
		{"16m", 16 << 20, ""},
		{"3G", 3 << 30, ""},
		{"2^20", 1 << 20, ""},
		{"2^0", 1, ""},
		{"2^31", 1 << 31, ""},
		{"4294967295", 4294967295, ""},
		{"", 0, "not a count"},
		{"M", 0, "not a count"},
		{"0", 0, "want 1 to"},
		{"0M", 0, "want 1 to"},
		{"-1", 0, "not a count"},
		{"1.5M", 0, "not a count"},
		{"1T", 0, "not a count"},
		{"1MB", 0, "not a count"},
		{"4G", 0, "exceeds"},
		{"4294967296", 0, "exceeds"},
		{"99999999999999999999", 0, "not a count"},
		{"17179869184G", 0, "exceeds"},
		{"2^32", 0, "want 1 to"},
		{"2^64", 0, "exponent"},
		{"2^", 0, "exponent"},
		{"2^-1", 0, "exponent"},
		{"3^4", 0, "powers of 2"},
	}
	for _, c := range cases {
		got, err := ParseSize(c.in)
		switch {
		case c.wantErr == "" && err != nil:
			t.Errorf("ParseSize(%q): %v", c.in, err)
		case c.wantErr == "" && got != c.want:
			t.Errorf("ParseSize(%q) = %d, want %d", c.in, got, c.want)
		case c.wantErr != "" && err == nil:
			t.Errorf("ParseSize(%q) = %d, want an error", c.in, got)
		case c.wantErr != "" && (!strings.Contains(err.Error(), c.wantErr) || !strings.Contains(err.Error(), c.in)):
			t.Errorf("ParseSize(%q) error %q: want it to name the input and say %q", c.in, err, c.wantErr)
		}
	}
}

func TestParseSizes(t *testing.T) {
	got, err := ParseSizes("1M,1000,2^4")
	if err != nil || len(got) != 3 || got[0] != 1<<20 || got[1] != 1000 || got[2] != 16 {
		t.Fatalf("ParseSizes = %v, %v", got, err)
	}
	if _, err := ParseSizes("1M,,2"); err == nil {
		t.Fatal("ParseSizes accepted an empty item")
	}
}

func TestFormatSizeRoundTrip(t *testing.T) {
	for _, n := range []int{1, 1000, 1024, 1536 << 10, 1 << 20, 16 << 20, 3 << 30, 1<<20 + 1} {
		s := FormatSize(n)
		back, err := ParseSize(s)
		if err != nil || back != n {
			t.Errorf("FormatSize(%d) = %q, which parses to %d, %v", n, s, back, err)
		}
	}
	if s := FormatSize(16 << 20); s != "16M" {
		t.Errorf("FormatSize(16Mi) = %q, want 16M", s)
	}
}
