package bench

import (
	"io"

	"github.com/gradcomp/gradcomp/internal/outfile"
)

// WriteJSON writes results as an indented JSON array of Result objects (see
// Result for the field names), followed by a newline.
func WriteJSON(w io.Writer, results []Result) error {
	return outfile.WriteJSONArray(w, results)
}
