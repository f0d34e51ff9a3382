package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode/utf8"
)

// WriteTable writes results as a fixed-width text table with one row per
// result and the columns a reader compares: ratio, throughputs, error,
// recall, lossless gain and cost, and the error column when a codec failed.
// Text is left-aligned and numbers right-aligned; a figure that does not
// apply, or that a failed codec did not produce, is "-". Sizes are written
// as FormatSize writes them.
func WriteTable(w io.Writer, results []Result) error {
	failed := slices.ContainsFunc(results, func(r Result) bool { return r.Error != "" })
	var shown []column
	for _, c := range columns {
		if c.title != "" && (c.key != "error" || failed) {
			shown = append(shown, c)
		}
	}
	rows := make([][]string, 0, len(results)+1)
	head := make([]string, len(shown))
	for j, c := range shown {
		head[j] = c.title
	}
	rows = append(rows, head)
	for i := range results {
		row := make([]string, len(shown))
		for j, c := range shown {
			row[j] = tableCell(c, c.value(&results[i]), results[i].Error != "")
		}
		rows = append(rows, row)
	}
	width := make([]int, len(shown))
	for _, row := range rows {
		for j, cell := range row {
			width[j] = max(width[j], utf8.RuneCountInString(cell))
		}
	}
	var b strings.Builder
	for _, row := range rows {
		b.Reset()
		for j, cell := range row {
			pad := strings.Repeat(" ", width[j]-utf8.RuneCountInString(cell))
			if j > 0 {
				b.WriteString("  ")
			}
			if shown[j].verb == "" && shown[j].key != "size" {
				b.WriteString(cell + pad) // text, left-aligned
			} else {
				b.WriteString(pad + cell)
			}
		}
		if _, err := fmt.Fprintln(w, strings.TrimRight(b.String(), " ")); err != nil {
			return err
		}
	}
	return nil
}

// tableCell formats v, a value of column c, for the text table; failed
// says the row's codec refused its input, so it has no figures.
func tableCell(c column, v any, failed bool) string {
	switch v := v.(type) {
	case *float64:
		if v == nil {
			return "-"
		}
		return tableCell(c, *v, failed)
	case float64:
		if failed {
			return "-"
		}
		return fmt.Sprintf(c.verb, v)
	case int:
		if c.key == "size" {
			return FormatSize(v)
		}
	}
	return fmt.Sprint(v)
}
