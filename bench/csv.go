package bench

import (
	"encoding/csv"
	"io"
)

// WriteCSV writes results as CSV: a header row of the JSON field names, then
// one row per result. A figure that does not apply is an empty cell; floats
// carry the shortest decimal form that reads back to the same float64.
func WriteCSV(w io.Writer, results []Result) error {
	cw := csv.NewWriter(w)
	row := make([]string, len(columns))
	for i, c := range columns {
		row[i] = c.key
	}
	if err := cw.Write(row); err != nil {
		return err
	}
	for i := range results {
		for j, c := range columns {
			row[j] = csvCell(c.value(&results[i]))
		}
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}
