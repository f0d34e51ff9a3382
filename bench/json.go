package bench

import (
	"encoding/json"
	"io"
)

// WriteJSON writes results as an indented JSON array of Result objects (see
// Result for the field names), followed by a newline.
func WriteJSON(w io.Writer, results []Result) error {
	if results == nil {
		results = []Result{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(results)
}
