// Package readmetest builds the README's Go blocks as the programs they
// claim to be, so that the code a user copies compiles against the API as
// it is. The blocks are laid into the module through a build overlay
// (nothing is written into the source tree), so they build offline from the
// module cache with the module's own go.mod.
package readmetest

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Blocks returns the ```go blocks of the README's section under heading, a
// whole heading line such as "## Quick start", up to the next heading of
// the same or a higher level. It fails t when the section is missing or a
// block is not closed.
func Blocks(t testing.TB, heading string) []string {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join(moduleRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(readme), "\n")
	start := slices.Index(lines, heading)
	if start < 0 {
		t.Fatalf("README.md has no %q section", heading)
	}
	level := headingLevel(heading)
	var blocks []string
	var block []string // the lines of the Go block being read
	fence := ""        // the fence line of the block being read, "" outside one
	for _, line := range lines[start+1:] {
		switch {
		case fence == "" && strings.HasPrefix(line, "```"):
			fence = line
			block = nil
		case fence != "" && line == "```":
			if fence == "```go" {
				blocks = append(blocks, strings.Join(block, "\n")+"\n")
			}
			fence = ""
		case fence != "":
			block = append(block, line)
		case headingLevel(line) > 0 && headingLevel(line) <= level:
			return blocks
		}
	}
	if fence != "" {
		t.Fatalf("a code block of the README's %q section is not closed", heading)
	}
	return blocks
}

// headingLevel is the number of #s that open a Markdown heading line, 0 for
// another line.
func headingLevel(line string) int {
	n := len(line) - len(strings.TrimLeft(line, "#"))
	if n == 0 || !strings.HasPrefix(line[n:], " ") {
		return 0
	}
	return n
}

// Program returns the first Go block under heading (see Blocks), which must
// be a complete program starting with "package main".
func Program(t testing.TB, heading string) string {
	t.Helper()
	blocks := Blocks(t, heading)
	if len(blocks) == 0 {
		t.Fatalf("the README's %q section has no ```go block", heading)
	}
	if !strings.HasPrefix(blocks[0], "package main\n") {
		t.Fatalf("%q: the block must be a complete program starting with \"package main\"; it starts with %.40q", heading, blocks[0])
	}
	return blocks[0]
}

// Build compiles each source, a complete Go file, as a package of its own
// in this module, and fails t with the compiler's output if one does not
// compile.
func Build(t testing.TB, sources ...string) {
	t.Helper()
	root := moduleRoot(t)
	dir := t.TempDir()
	replace := map[string]string{}
	var pkgs []string
	for i, src := range sources {
		file := filepath.Join(dir, fmt.Sprintf("block%d.go", i+1))
		if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		pkg := fmt.Sprintf("internal/readmetest/block%d", i+1)
		replace[filepath.Join(root, filepath.FromSlash(pkg), "block.go")] = file
		pkgs = append(pkgs, "./"+pkg)
	}
	overlay, err := json.Marshal(map[string]map[string]string{"Replace": replace})
	if err != nil {
		t.Fatal(err)
	}
	overlayFile := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(overlayFile, overlay, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(GoTool(t), append([]string{"build", "-overlay=" + overlayFile, "-o", os.DevNull}, pkgs...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOPROXY=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("README code does not compile: %v\n%s\n%s", err, out, strings.Join(sources, "\n----\n"))
	}
}

// GoTool finds the go command; go test puts its own toolchain's first on
// PATH.
func GoTool(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("go")
	if err != nil {
		t.Fatal("no go command:", err)
	}
	return p
}

// moduleRoot is the directory of the go.mod above the test's package.
func moduleRoot(t testing.TB) string {
	t.Helper()
	dir, err := filepath.Abs(".")
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
