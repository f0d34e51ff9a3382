package doccheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// TestGoIdentifiers fails for every Go identifier that README.md or
// docs/*.md names and the module does not declare.
//
// What counts as a reference: inside inline code spans (`...`) and in
// fenced blocks labelled go, a selector PKG.Name or PKG.Name.Member not
// preceded by a letter, digit, '_', '.', '/' or '-', where
//
//   - PKG is a package of this module, written as its last path element
//     (`overlap.Config`) or as a path inside the module (`comm/inproc.New`);
//     a package main (cmd/gradcomp, plugin) is not one;
//   - Name begins with an upper-case letter.
//
// So `gradcomp.torch.State` (no Go package gradcomp), `torch.distributed`,
// `runtime.GOMAXPROCS` (not this module's), `overlap/core.go` and
// `compress.test` (lower-case after the dot), `gc_engine_create` and shell
// words are not references.
//
// What counts as declared: Name is a package-level type, func, var or
// const in any .go file of the package's directory, whatever its build
// tags, _test.go files included (package PKG or PKG_test); Member is a
// method of that type, a field of it (a struct field, an embedded type's
// name, an interface's method), or such a member of a type it embeds or is
// defined as, followed through this module's packages (a member of an
// embedded type from outside the module is taken on trust).
//
// A failure names file:line, the reference and what is missing.
func TestGoIdentifiers(t *testing.T) {
	root := repoRoot(t)
	pkgs := loadPackages(t, root)
	checked := 0
	for _, doc := range documents(t, root) {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, doc)
		for _, r := range references(string(text)) {
			p := pkgs.resolve(r.pkg)
			if p == nil {
				continue
			}
			checked++
			if !p.declares(r.name) {
				t.Errorf("%s:%d: `%s`: package %s declares no %s", rel, r.line, r.text, p.dir, r.name)
				continue
			}
			if r.member != "" && !pkgs.hasMember(p, r.name, r.member, 0) {
				t.Errorf("%s:%d: `%s`: %s.%s has no method or field %s", rel, r.line, r.text, p.name, r.name, r.member)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no Go identifier found in the documentation: the scan is broken")
	}
}

// documents are README.md and docs/*.md.
func documents(t *testing.T, root string) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{filepath.Join(root, "README.md")}, docs...)
}

// reference is one PKG.Name[.Member] found in a document.
type reference struct {
	line              int
	text              string
	pkg, name, member string
}

var (
	// selector is PKG.Name[.Member], PKG lower-case path elements.
	selector = regexp.MustCompile(`(?:^|[^\w./-])((?:[a-z][a-z0-9_]*/)*[a-z][a-z0-9_]*)\.([A-Z]\w*)(?:\.([A-Za-z_]\w*))?`)
	// fence opens or closes a fenced code block; its info string follows.
	fence = regexp.MustCompile("^ {0,3}(```+|~~~+)\\s*([A-Za-z0-9_+-]*)")
)

// references returns the references in a Markdown text: those in inline
// code spans outside fenced blocks, and those anywhere in fenced blocks
// labelled go.
func references(text string) []reference {
	var refs []reference
	var prose []byte // the text outside fences; fence lines blank
	var lineOf []int // line index in prose → line in the document
	var open string  // the fence that opened the block we are in
	goBlock := false
	for i, l := range strings.Split(text, "\n") {
		lineOf = append(lineOf, i+1)
		m := fence.FindStringSubmatch(l)
		switch {
		case open == "" && m != nil:
			open, goBlock = m[1], m[2] == "go"
			l = ""
		case open != "" && m != nil && strings.HasPrefix(m[1], open) && m[2] == "":
			open = ""
			l = ""
		case open != "":
			if goBlock {
				refs = append(refs, selectors(l, i+1)...)
			}
			l = ""
		}
		prose = append(append(prose, l...), '\n')
	}
	line := 0
	for i := 0; i < len(prose); {
		if prose[i] == '\n' {
			line++
			i++
			continue
		}
		if prose[i] != '`' {
			i++
			continue
		}
		n := runLen(prose, i)
		end := -1 // the closing run: the next one of exactly n backticks
		for j := i + n; j < len(prose); {
			if prose[j] != '`' {
				j++
				continue
			}
			if k := runLen(prose, j); k == n {
				end = j
				break
			} else {
				j += k
			}
		}
		if end < 0 {
			i += n // a literal run of backticks
			continue
		}
		span := string(prose[i+n : end])
		refs = append(refs, selectors(strings.ReplaceAll(span, "\n", " "), lineOf[line])...)
		line += strings.Count(span, "\n")
		i = end + n
	}
	sort.SliceStable(refs, func(i, j int) bool { return refs[i].line < refs[j].line })
	return refs
}

// runLen is the length of the run of backticks at b[i:].
func runLen(b []byte, i int) int {
	n := 0
	for i+n < len(b) && b[i+n] == '`' {
		n++
	}
	return n
}

// selectors returns the PKG.Name[.Member] selectors in s, on line.
func selectors(s string, line int) []reference {
	var refs []reference
	for _, m := range selector.FindAllStringSubmatch(s, -1) {
		r := reference{line: line, pkg: m[1], name: m[2], member: m[3]}
		r.text = r.pkg + "." + r.name
		if r.member != "" {
			r.text += "." + r.member
		}
		refs = append(refs, r)
	}
	return refs
}

// pkg is the declarations of one directory of the module.
type pkg struct {
	dir, name string
	decls     map[string]bool            // package-level names
	members   map[string]map[string]bool // type → methods and fields
	bases     map[string][]ast.Expr      // type → types it embeds or is defined as
}

func (p *pkg) declares(name string) bool { return p.decls[name] }

type packages struct {
	byDir  map[string]*pkg // slash path relative to the root
	byName map[string][]*pkg
}

// resolve finds the package a reference's PKG names: a directory of the
// module, or the last path element of one.
func (ps *packages) resolve(name string) *pkg {
	if strings.Contains(name, "/") {
		return ps.byDir[name]
	}
	if c := ps.byName[path.Base(name)]; len(c) == 1 {
		return c[0]
	} else if len(c) > 1 {
		// Several packages of one name: a merged view of their
		// declarations, so that none is reported missing wrongly.
		m := &pkg{dir: name, name: name, decls: map[string]bool{}, members: map[string]map[string]bool{}, bases: map[string][]ast.Expr{}}
		for _, p := range c {
			for k := range p.decls {
				m.decls[k] = true
			}
			for k, v := range p.members {
				if m.members[k] == nil {
					m.members[k] = map[string]bool{}
				}
				for f := range v {
					m.members[k][f] = true
				}
			}
			for k, v := range p.bases {
				m.bases[k] = append(m.bases[k], v...)
			}
		}
		return m
	}
	return nil
}

// hasMember reports whether type typ of p has member m, directly or
// through a type it embeds or is defined as.
func (ps *packages) hasMember(p *pkg, typ, m string, depth int) bool {
	if depth > 8 {
		return false
	}
	if p.members[typ][m] {
		return true
	}
	for _, b := range p.bases[typ] {
		switch b := unwrap(b).(type) {
		case *ast.Ident:
			if ps.hasMember(p, b.Name, m, depth+1) {
				return true
			}
		case *ast.SelectorExpr:
			x, ok := b.X.(*ast.Ident)
			if !ok {
				return true
			}
			q := ps.resolve(x.Name)
			if q == nil {
				return true // a type from outside the module: taken on trust
			}
			if ps.hasMember(q, b.Sel.Name, m, depth+1) {
				return true
			}
		default:
			return true
		}
	}
	return false
}

// unwrap strips pointers, parentheses and type arguments off a type.
func unwrap(e ast.Expr) ast.Expr {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.ParenExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		default:
			return e
		}
	}
}

// loadPackages parses every .go file of the module (build tags ignored)
// and indexes the declarations of each directory not of package main.
func loadPackages(t *testing.T, root string) *packages {
	t.Helper()
	ps := &packages{byDir: map[string]*pkg{}, byName: map[string][]*pkg{}}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			n := d.Name()
			if p != root && (strings.HasPrefix(n, ".") || strings.HasPrefix(n, "_") || n == "testdata" || n == "build" || n == "out") {
				return filepath.SkipDir
			}
			if p != root {
				if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
					return filepath.SkipDir // another module
				}
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(p))
		rel = filepath.ToSlash(rel)
		name := strings.TrimSuffix(f.Name.Name, "_test")
		if name == "main" {
			return nil
		}
		pk := ps.byDir[rel]
		if pk == nil {
			pk = &pkg{dir: rel, name: name, decls: map[string]bool{}, members: map[string]map[string]bool{}, bases: map[string][]ast.Expr{}}
			ps.byDir[rel] = pk
			ps.byName[name] = append(ps.byName[name], pk)
		}
		pk.add(f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ps.byDir) == 0 {
		t.Fatalf("no Go package under %s", root)
	}
	return ps
}

// add records f's declarations.
func (p *pkg) add(f *ast.File) {
	member := func(typ, name string) {
		if p.members[typ] == nil {
			p.members[typ] = map[string]bool{}
		}
		p.members[typ][name] = true
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil || len(d.Recv.List) == 0 {
				p.decls[d.Name.Name] = true
				continue
			}
			if id, ok := unwrap(d.Recv.List[0].Type).(*ast.Ident); ok {
				member(id.Name, d.Name.Name)
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.ValueSpec:
					for _, n := range s.Names {
						p.decls[n.Name] = true
					}
				case *ast.TypeSpec:
					typ := s.Name.Name
					p.decls[typ] = true
					switch u := s.Type.(type) {
					case *ast.StructType:
						for _, fl := range u.Fields.List {
							if len(fl.Names) == 0 {
								member(typ, embeddedName(fl.Type))
								p.bases[typ] = append(p.bases[typ], fl.Type)
							}
							for _, n := range fl.Names {
								member(typ, n.Name)
							}
						}
					case *ast.InterfaceType:
						for _, fl := range u.Methods.List {
							if len(fl.Names) == 0 {
								p.bases[typ] = append(p.bases[typ], fl.Type)
							}
							for _, n := range fl.Names {
								member(typ, n.Name)
							}
						}
					default:
						p.bases[typ] = append(p.bases[typ], s.Type)
					}
				}
			}
		}
	}
}

// embeddedName is the field name of an embedded type.
func embeddedName(e ast.Expr) string {
	switch x := unwrap(e).(type) {
	case *ast.Ident:
		return x.Name
	case *ast.SelectorExpr:
		return x.Sel.Name
	}
	return ""
}

// repoRoot is the directory of the go.mod above the test's directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}
