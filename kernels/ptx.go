package kernels

import (
	"embed"
	"io/fs"
	"sort"
)

// ptxFiles holds the generated PTX modules (see gen.go).
//
//go:embed ptx/*.ptx
var ptxFiles embed.FS

// ptxModules returns every embedded PTX module's text, by file name, in a
// fixed order.
func ptxModules() (names []string, texts [][]byte) {
	paths, _ := fs.Glob(ptxFiles, "ptx/*.ptx") // the pattern is valid
	sort.Strings(paths)
	for _, p := range paths {
		b, _ := ptxFiles.ReadFile(p) // embedded: cannot fail
		names = append(names, p)
		texts = append(texts, b)
	}
	return names, texts
}
