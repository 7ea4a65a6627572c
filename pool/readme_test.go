package pool_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadmeRunner builds the README's Runner example as the complete
// program it claims to be, laid into the module through a build overlay
// (nothing is written into the source tree), offline, with the module's own
// go.mod.
func TestReadmeRunner(t *testing.T) {
	buildReadmeBlock(t, "### Background jobs: `pool.Runner`")
}

func buildReadmeBlock(t *testing.T, heading string) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("README.md has no %q section", heading)
	}
	if next := strings.Index(section, "\n#"); next >= 0 {
		section = section[:next]
	}
	_, code, ok := strings.Cut(section, "\n```go\n")
	if !ok {
		t.Fatalf("%q has no ```go block", heading)
	}
	code, _, ok = strings.Cut(code, "\n```\n")
	if !ok || !strings.HasPrefix(code, "package main\n") {
		t.Fatalf("%q: the block must be a complete, closed program starting with \"package main\"", heading)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "main.go")
	if err := os.WriteFile(file, []byte(code+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pkg := filepath.Join(root, "pool", "internal", "readme")
	overlay, err := json.Marshal(map[string]map[string]string{"Replace": {filepath.Join(pkg, "main.go"): file}})
	if err != nil {
		t.Fatal(err)
	}
	overlayFile := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(overlayFile, overlay, 0o644); err != nil {
		t.Fatal(err)
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatal("no go command to compile the README with:", err)
	}
	cmd := exec.Command(goCmd, "build", "-overlay="+overlayFile, "-o", os.DevNull, "./pool/internal/readme")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOPROXY=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the README's %q block does not compile: %v\n%s\n%s", heading, err, out, code)
	}
}
