// Package doctest reads the module's documentation for tests: the prose
// that names every exported identifier and the Go blocks that must compile.
package doctest

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// Files lists the documentation files, relative to the module root:
// README.md, then every docs/*.md in name order.
func Files(t testing.TB) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(Root(t), "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(docs)
	files := []string{"README.md"}
	for _, d := range docs {
		files = append(files, filepath.Join("docs", filepath.Base(d)))
	}
	return files
}

// Text returns the contents of every file of Files, one after another.
func Text(t testing.TB) string {
	t.Helper()
	var b strings.Builder
	for _, f := range Files(t) {
		b.WriteString(read(t, f))
		b.WriteString("\n")
	}
	return b.String()
}

// Section returns the text under heading (a whole line such as
// "## Quick start") in whichever documentation file has it, up to the next
// heading of the same or a higher level.
func Section(t testing.TB, heading string) string {
	t.Helper()
	level := len(heading) - len(strings.TrimLeft(heading, "#"))
	for _, f := range Files(t) {
		_, section, ok := strings.Cut("\n"+read(t, f), "\n"+heading+"\n") // a file's first line too
		if !ok {
			continue
		}
		for rest, at := section, 0; ; {
			i := strings.Index(rest, "\n#")
			if i < 0 {
				return section
			}
			line := rest[i+1:]
			if n := len(line) - len(strings.TrimLeft(line, "#")); n <= level && strings.HasPrefix(line[n:], " ") {
				return section[:at+i]
			}
			rest, at = rest[i+2:], at+i+2
		}
	}
	t.Fatalf("no documentation file (%s) has the heading %q", strings.Join(Files(t), ", "), heading)
	return ""
}

// GoBlocks returns the ```go blocks of a section, each ending in a newline.
func GoBlocks(t testing.TB, section string) []string {
	t.Helper()
	return Blocks(t, section, "go")
}

// Blocks returns the fenced blocks of language lang (```sql) of a section,
// each ending in a newline.
func Blocks(t testing.TB, section, lang string) []string {
	t.Helper()
	var blocks []string
	for {
		_, code, ok := strings.Cut(section, "\n```"+lang+"\n")
		if !ok {
			return blocks
		}
		code, section, ok = strings.Cut(code, "\n```\n")
		if !ok {
			t.Fatalf("a %s block is not closed: %.60q", lang, code)
		}
		blocks = append(blocks, code+"\n")
	}
}

// Build compiles Go sources as if they were files of the module, offline,
// with the module's own go.mod. files maps a path relative to the module
// root (in a directory that need not exist) to its source; the sources are
// laid in through a build overlay, so nothing is written into the tree. what
// names the code in the failure.
func Build(t testing.TB, what string, files map[string]string) {
	t.Helper()
	build(t, what, files, os.DevNull)
}

// Executable is Build for the sources of one main package, and returns the
// executable's path (in a temporary directory), for a test to run it.
func Executable(t testing.TB, what string, files map[string]string) string {
	t.Helper()
	exe := filepath.Join(t.TempDir(), "program")
	build(t, what, files, exe)
	return exe
}

// build is Build, writing the executable (of a single main package) to out.
func build(t testing.TB, what string, files map[string]string, out string) {
	t.Helper()
	root, dir := Root(t), t.TempDir()
	replace := map[string]string{}
	pkgs := map[string]bool{}
	for i, name := range sortedKeys(files) {
		tmp := filepath.Join(dir, strconv.Itoa(i)+"_"+filepath.Base(name))
		if err := os.WriteFile(tmp, []byte(files[name]), 0o644); err != nil {
			t.Fatal(err)
		}
		replace[filepath.Join(root, name)] = tmp
		pkgs["./"+filepath.ToSlash(filepath.Dir(name))] = true
	}
	overlay, err := json.Marshal(map[string]map[string]string{"Replace": replace})
	if err != nil {
		t.Fatal(err)
	}
	overlayFile := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(overlayFile, overlay, 0o644); err != nil {
		t.Fatal(err)
	}
	goCmd, err := exec.LookPath("go") // go test puts its own toolchain's first on PATH
	if err != nil {
		t.Fatal("no go command to compile the documentation with:", err)
	}
	cmd := exec.Command(goCmd, append([]string{"build", "-overlay=" + overlayFile, "-o", out}, sortedKeys(pkgs)...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOPROXY=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s does not compile: %v\n%s", what, err, out)
	}
}

// Root returns the root module's directory: the nearest directory above the
// working directory whose go.mod declares github.com/tenantdb/tenantdb, so
// that tests in the nested modules read the same documentation.
func Root(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(b), "module github.com/tenantdb/tenantdb\n") {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod of github.com/tenantdb/tenantdb above the working directory")
		}
		dir = parent
	}
}

func read(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(Root(t), name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// BuildProgram builds the first Go block under heading, which must be a
// complete program ("package main"), as package dir of the module.
func BuildProgram(t testing.TB, heading, dir string) {
	t.Helper()
	Build(t, fmt.Sprintf("the %q block", heading), map[string]string{dir + "/main.go": program(t, heading)})
}

// BuildExecutable builds the first Go block under heading, a complete
// program, as package dir of the module, and returns the executable's path
// (in a temporary directory), for a test to run it as a user would.
func BuildExecutable(t testing.TB, heading, dir string) string {
	t.Helper()
	exe := filepath.Join(t.TempDir(), filepath.Base(dir))
	build(t, fmt.Sprintf("the %q block", heading), map[string]string{dir + "/main.go": program(t, heading)}, exe)
	return exe
}

// program returns the first Go block under heading, which must be a
// complete program.
func program(t testing.TB, heading string) string {
	t.Helper()
	blocks := GoBlocks(t, Section(t, heading))
	if len(blocks) == 0 || !strings.HasPrefix(blocks[0], "package main\n") {
		t.Fatalf("%q: want a Go block that is a complete program starting with \"package main\"", heading)
	}
	return blocks[0]
}
