// Package outfile writes report files: create, fill, close, and say which
// file failed.
package outfile

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// Write creates (or truncates) path and fills it with write. It returns the
// first error of creating, writing or closing, naming path.
func Write(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	err = write(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// WriteJSONArray writes items as an indented JSON array followed by a
// newline; a nil slice is written as [] rather than null.
func WriteJSONArray[T any](w io.Writer, items []T) error {
	if items == nil {
		items = []T{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(items)
}
