package bench

// Result holds the figures of one codec spec on one gradient size. Its JSON
// form (the tags below) is the report's schema; fields that do not apply to a
// codec are omitted.
type Result struct {
	Codec   string `json:"codec"`   // canonical codec spec
	Size    int    `json:"size"`    // elements in the gradient
	Dist    string `json:"dist"`    // distribution the gradient was drawn from
	Workers int    `json:"workers"` // goroutines per Compress/Decompress call and per copy

	PayloadBytes int     `json:"payload_bytes"` // length of one payload, framing included
	Ratio        float64 `json:"ratio"`         // 4·Size / PayloadBytes

	EncodeGBps     float64 `json:"encode_gbps"`      // Compress, 10⁹ fp32 input bytes per second
	DecodeGBps     float64 `json:"decode_gbps"`      // DecompressAdd, 10⁹ fp32 output bytes per second
	MemcpyGBps     float64 `json:"memcpy_gbps"`      // copy of the 4·Size input bytes, same rounds
	EncodeVsMemcpy float64 `json:"encode_vs_memcpy"` // EncodeGBps / MemcpyGBps
	Rounds         int     `json:"rounds"`           // timing rounds; each figure is the best of them

	RelL2Error float64 `json:"rel_l2_error"` // ‖x − D(C(x))‖ / ‖x‖

	// Recall is set for sampled top-k only: its Recall against exact top-k
	// of the same ratio on the same input.
	Recall *float64 `json:"recall,omitempty"`

	// Lossless names the lossless stage of a spec that has one. The two
	// figures compare it with the same spec without the stage, measured in
	// the same rounds: the payload shrink factor (base bytes / these bytes,
	// above 1 when the stage pays) and the encode time factor (this encode
	// time / base encode time).
	Lossless               string   `json:"lossless,omitempty"`
	LosslessRatioGain      *float64 `json:"lossless_ratio_gain,omitempty"`
	LosslessEncodeSlowdown *float64 `json:"lossless_encode_slowdown,omitempty"`

	// Error is set when the codec refused the input (for instance a value
	// fp16 cannot hold); the figures above are then zero.
	Error string `json:"error,omitempty"`
}
