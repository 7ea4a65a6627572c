package tenantdb_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadmeQuickStartCompiles builds the README's quick start as the
// complete program it claims to be, so that the first code a user copies
// compiles against the API as it is. The block is laid into the module
// through a build overlay (no file is written into the source tree), so it
// builds offline from the module cache with the module's own go.mod.
func TestReadmeQuickStartCompiles(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	src := quickStart(t, string(readme))
	if !strings.HasPrefix(src, "package main\n") {
		t.Fatalf("the quick start must be a complete program starting with \"package main\"; it starts with %.40q", src)
	}

	dir := t.TempDir()
	file := filepath.Join(dir, "main.go")
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	pkg := filepath.Join(root, "tenantdb", "internal", "readmequickstart")
	overlay, err := json.Marshal(map[string]map[string]string{
		"Replace": {filepath.Join(pkg, "main.go"): file},
	})
	if err != nil {
		t.Fatal(err)
	}
	overlayFile := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(overlayFile, overlay, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goTool(t), "build", "-overlay="+overlayFile, "-o", os.DevNull, "./tenantdb/internal/readmequickstart")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOPROXY=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the README's quick start does not compile: %v\n%s", err, out)
	}
}

// quickStart returns the first Go code block under the README's
// "## Quick start" heading.
func quickStart(t *testing.T, readme string) string {
	t.Helper()
	_, section, ok := strings.Cut(readme, "\n## Quick start\n")
	if !ok {
		t.Fatal(`README.md has no "## Quick start" section`)
	}
	if next := strings.Index(section, "\n## "); next >= 0 {
		section = section[:next]
	}
	_, code, ok := strings.Cut(section, "\n```go\n")
	if !ok {
		t.Fatal("the README's quick start has no ```go block")
	}
	code, _, ok = strings.Cut(code, "\n```\n")
	if !ok {
		t.Fatal("the README's quick start block is not closed")
	}
	return code + "\n"
}

// goTool finds the go command; go test puts its own toolchain's first on PATH.
func goTool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("go")
	if err != nil {
		t.Fatal("no go command to compile the README with:", err)
	}
	return p
}
