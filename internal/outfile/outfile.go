// Package outfile writes report files: create, fill, close, and say which
// file failed.
package outfile

import (
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
