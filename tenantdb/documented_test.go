package tenantdb_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/tenantdb/tenantdb/internal/doctest"
)

// TestExportedNamesDocumented: every exported name of pool and tenantdb (a
// type, function, method, constant, variable, struct field or interface
// method) is in the documentation (README.md, docs/*.md) or in an Example
// function. A top-level name must
// appear as a word; a member as .Name, `Name` or Name:, so that a common word
// in prose does not count for it.
func TestExportedNamesDocumented(t *testing.T) {
	// words holds every identifier of the docs; members, those written as
	// .Name, `Name` or Name:.
	words, members := map[string]bool{}, map[string]bool{}
	docs := doctest.Text(t) + exampleBodies(t, "../pool", ".")
	for _, m := range regexp.MustCompile("([.`]?)([A-Za-z_][A-Za-z0-9_]*)(:?)").FindAllStringSubmatch(docs, -1) {
		words[m[2]] = true
		if m[1] != "" || m[3] != "" {
			members[m[2]] = true
		}
	}
	for _, dir := range []string{"../pool", "."} {
		for _, name := range exportedNames(t, dir) {
			found := words[name]
			if _, member, ok := strings.Cut(name, "."); ok {
				found = members[member]
			}
			if !found {
				t.Errorf("%s: %s is neither in the documentation (%s) nor in an Example", filepath.Base(filepath.Clean(dir)), name, strings.Join(doctest.Files(t), ", "))
			}
		}
	}
}

// exampleBodies returns the source of every Example function in the
// example_test.go files below dirs.
func exampleBodies(t *testing.T, dirs ...string) string {
	t.Helper()
	var b strings.Builder
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !strings.HasSuffix(path, "example_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, src, 0)
			if err != nil {
				return err
			}
			for _, d := range f.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && strings.HasPrefix(fd.Name.Name, "Example") {
					b.Write(src[fset.Position(fd.Pos()).Offset:fset.Position(fd.End()).Offset])
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}

// exportedNames lists the exported names of the package in dir, members as
// Type.Name.
func exportedNames(t *testing.T, dir string) []string {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	add := func(owner, name string) {
		switch {
		case !ast.IsExported(name):
		case owner == "":
			names = append(names, name)
		case ast.IsExported(owner):
			names = append(names, owner+"."+name)
		}
	}
	for _, pkg := range pkgs {
		for _, f := range pkg.Files {
			for _, decl := range f.Decls {
				switch d := decl.(type) {
				case *ast.FuncDecl:
					add(receiver(d), d.Name.Name)
				case *ast.GenDecl:
					for _, spec := range d.Specs {
						switch s := spec.(type) {
						case *ast.ValueSpec:
							for _, n := range s.Names {
								add("", n.Name)
							}
						case *ast.TypeSpec:
							add("", s.Name.Name)
							var members []*ast.Field
							switch typ := s.Type.(type) {
							case *ast.StructType:
								members = typ.Fields.List
							case *ast.InterfaceType:
								members = typ.Methods.List
							}
							for _, m := range members {
								for _, n := range m.Names {
									add(s.Name.Name, n.Name)
								}
							}
						}
					}
				}
			}
		}
	}
	if len(names) == 0 {
		t.Fatalf("no exported names in %s", dir)
	}
	return names
}

// receiver returns the name of d's receiver type, "" for a function; an
// unexported type's methods count as unexported.
func receiver(d *ast.FuncDecl) string {
	if d.Recv == nil {
		return ""
	}
	typ := d.Recv.List[0].Type
	if star, ok := typ.(*ast.StarExpr); ok {
		typ = star.X
	}
	if idx, ok := typ.(*ast.IndexExpr); ok {
		typ = idx.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name
	}
	return "_"
}
