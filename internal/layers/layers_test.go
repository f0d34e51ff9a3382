package layers

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/gradcomp/gradcomp/"

// allowed lists, for each package of the lower layers (a path relative to
// the module root), the gradcomp packages its non-test files may import,
// whatever their build tags. It is docs/DESIGN.md's sentence "Imports
// point downward only", written as data.
var allowed = map[string][]string{
	"gpu":               nil,
	"compress":          nil,
	"compress/lowrank":  {"compress"},
	"comm":              {"gpu"},
	"nccl":              {"gpu"},
	"kernels":           {"compress", "compress/lowrank", "gpu"},
	"comm/ncclcomm":     {"comm", "gpu", "nccl"},
	"internal/devresid": {"compress", "gpu", "internal/f32"},
	"internal/record":   {"comm"},
	"overlap": {"compress", "compress/lowrank", "comm", "comm/twolevel", "gpu", "kernels",
		"internal/devresid", "internal/f32", "internal/record", "internal/workq"},
}

// TestImportsPointDown fails, naming the file and the import, when a
// package of the lower layers imports a gradcomp package not listed for it.
func TestImportsPointDown(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for pkg, ok := range allowed {
		dir := filepath.Join(root, filepath.FromSlash(pkg))
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Errorf("%s: no Go files in %s (%v): is the table out of date?", pkg, dir, err)
			continue
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			for _, imp := range imports(t, f) {
				own, found := strings.CutPrefix(imp, module)
				if found && !slices.Contains(ok, own) {
					rel, _ := filepath.Rel(root, f)
					t.Errorf("%s imports %s: %s may import only %v of gradcomp (docs/DESIGN.md, section 1)", rel, imp, pkg, ok)
				}
			}
		}
	}
}

// TestTableNamesEveryPackage fails when a listed package does not exist,
// or an allowed import names no package of the module.
func TestTableNamesEveryPackage(t *testing.T) {
	for pkg, ok := range allowed {
		for _, p := range append([]string{pkg}, ok...) {
			if fi, err := os.Stat(filepath.Join("../..", filepath.FromSlash(p))); err != nil || !fi.IsDir() {
				t.Errorf("the table names %s, which is not a package directory of the module", p)
			}
		}
	}
}

// imports returns the import paths of the Go file f.
func imports(t *testing.T, f string) []string {
	t.Helper()
	af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
	if err != nil {
		t.Fatalf("%s: %v", f, err)
	}
	var out []string
	for _, s := range af.Imports {
		p, err := strconv.Unquote(s.Path.Value)
		if err != nil {
			t.Fatalf("%s: import %s: %v", f, s.Path.Value, err)
		}
		out = append(out, p)
	}
	return out
}
