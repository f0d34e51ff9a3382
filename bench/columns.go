package bench

import (
	"fmt"
	"strconv"
)

// column is one field of the tabular reports (text table and CSV).
type column struct {
	key   string // CSV header, the same as the JSON field name
	title string // text-table header; "" leaves the column out of the table
	// value returns the field of r: a string, an int, a float64, or a nil
	// *float64 for a figure that does not apply.
	value func(r *Result) any
	verb  string // fmt verb of a float64 in the text table
}

// columns lists the report columns in order.
var columns = []column{
	{"codec", "codec", func(r *Result) any { return r.Codec }, ""},
	{"size", "size", func(r *Result) any { return r.Size }, ""},
	{"dist", "", func(r *Result) any { return r.Dist }, ""},
	{"workers", "", func(r *Result) any { return r.Workers }, ""},
	{"payload_bytes", "", func(r *Result) any { return r.PayloadBytes }, ""},
	{"ratio", "ratio", func(r *Result) any { return r.Ratio }, "%.2f"},
	{"encode_gbps", "enc GB/s", func(r *Result) any { return r.EncodeGBps }, "%.3f"},
	{"decode_gbps", "dec GB/s", func(r *Result) any { return r.DecodeGBps }, "%.3f"},
	{"memcpy_gbps", "copy GB/s", func(r *Result) any { return r.MemcpyGBps }, "%.2f"},
	{"encode_vs_memcpy", "enc/copy", func(r *Result) any { return r.EncodeVsMemcpy }, "%.3f"},
	{"rounds", "", func(r *Result) any { return r.Rounds }, ""},
	{"rel_l2_error", "rel L2 err", func(r *Result) any { return r.RelL2Error }, "%.3g"},
	{"recall", "recall", func(r *Result) any { return r.Recall }, "%.4f"},
	{"lossless", "", func(r *Result) any { return r.Lossless }, ""},
	{"lossless_ratio_gain", "lossless gain", func(r *Result) any { return r.LosslessRatioGain }, "%.3f"},
	{"lossless_encode_slowdown", "lossless enc×", func(r *Result) any { return r.LosslessEncodeSlowdown }, "%.2f"},
	{"error", "error", func(r *Result) any { return r.Error }, ""},
}

// csvCell formats v (a column value) for CSV: floats with the fewest digits
// that read back exactly, a nil pointer as the empty string.
func csvCell(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case int:
		return strconv.Itoa(v)
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	case *float64:
		if v == nil {
			return ""
		}
		return csvCell(*v)
	}
	return fmt.Sprint(v)
}
