package tenantsql_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// readmeSection is the README heading whose Go blocks
// TestReadmeDatabaseSQLCompiles builds.
const readmeSection = "## database/sql (GORM, sqlx, bun, goose)"

// TestReadmeDatabaseSQLCompiles builds every Go block of the README's
// database/sql section as the package it claims to be, one package per
// block, so that the snippets a user copies for GORM, sqlx, bun and goose
// compile against the API as it is. The blocks are laid into the module
// through a build overlay (nothing is written into the source tree), so they
// build offline with the module's own go.mod.
func TestReadmeDatabaseSQLCompiles(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := goBlocks(t, string(readme), readmeSection)
	if len(blocks) < 4 {
		t.Fatalf("the README's database/sql section has %d Go blocks; want one per library (GORM, sqlx, bun, goose)", len(blocks))
	}
	for _, lib := range []string{"gorm.io/gorm", "github.com/jmoiron/sqlx", "github.com/uptrace/bun", "github.com/pressly/goose/v3"} {
		if !strings.Contains(strings.Join(blocks, "\n"), `"`+lib+`"`) {
			t.Errorf("no Go block of the README's database/sql section imports %s", lib)
		}
	}

	dir := t.TempDir()
	replace := map[string]string{}
	var pkgs []string
	for i, src := range blocks {
		if !strings.HasPrefix(src, "package ") {
			t.Fatalf("Go block %d of the database/sql section must be a complete file starting with \"package\"; it starts with %.40q", i+1, src)
		}
		file := filepath.Join(dir, fmt.Sprintf("block%d.go", i+1))
		if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		pkg := fmt.Sprintf("tenantdb/tenantsql/internal/readme%d", i+1)
		replace[filepath.Join(root, pkg, "example.go")] = file
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
	cmd := exec.Command(goTool(t), append([]string{"build", "-overlay=" + overlayFile, "-o", os.DevNull}, pkgs...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOPROXY=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the README's database/sql snippets do not compile: %v\n%s", err, out)
	}
}

// TestNoORMLinked checks that package tenantsql, and so a program that uses
// it or the pgx API, links none of the libraries its tests use.
func TestNoORMLinked(t *testing.T) {
	cmd := exec.Command(goTool(t), "list", "-deps", "github.com/tenantdb/tenantdb/tenantdb/tenantsql")
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOPROXY=off")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, lib := range []string{"gorm.io/", "github.com/jmoiron/sqlx", "github.com/uptrace/bun", "github.com/pressly/goose"} {
			if strings.HasPrefix(dep, lib) {
				t.Errorf("tenantsql links %s", dep)
			}
		}
	}
	if !strings.Contains(string(out), "github.com/jackc/pgx/v5/stdlib\n") {
		t.Fatalf("go list -deps does not show pgx's stdlib; the check reads the wrong output:\n%s", out)
	}
}

// goBlocks returns the ```go blocks under heading, up to the next "## ".
func goBlocks(t *testing.T, readme, heading string) []string {
	t.Helper()
	_, section, ok := strings.Cut(readme, "\n"+heading+"\n")
	if !ok {
		t.Fatalf("README.md has no %q section", heading)
	}
	if next := strings.Index(section, "\n## "); next >= 0 {
		section = section[:next]
	}
	var blocks []string
	for {
		var code string
		_, code, ok = strings.Cut(section, "\n```go\n")
		if !ok {
			return blocks
		}
		code, section, ok = strings.Cut(code, "\n```\n")
		if !ok {
			t.Fatal("a Go block of the README's database/sql section is not closed")
		}
		blocks = append(blocks, code+"\n")
	}
}

// goTool finds the go command; go test puts its own toolchain's first on PATH.
func goTool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("go")
	if err != nil {
		t.Fatal("no go command:", err)
	}
	return p
}
