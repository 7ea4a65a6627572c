package tenantsql_test

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/tenantdb/tenantdb/internal/doctest"
)

// readmeSection is the documentation heading whose Go blocks
// TestReadmeDatabaseSQLCompiles builds.
const readmeSection = "## database/sql (GORM, sqlx, bun, goose)"

// TestReadmeDatabaseSQLCompiles builds every Go block of the documented
// database/sql section as the package it claims to be, one package per
// block, so that the snippets a user copies for GORM, sqlx, bun and goose
// compile against the API as it is.
func TestReadmeDatabaseSQLCompiles(t *testing.T) {
	blocks := doctest.GoBlocks(t, doctest.Section(t, readmeSection))
	if len(blocks) < 4 {
		t.Fatalf("the database/sql section has %d Go blocks; want one per library (GORM, sqlx, bun, goose)", len(blocks))
	}
	for _, lib := range []string{"gorm.io/gorm", "github.com/jmoiron/sqlx", "github.com/uptrace/bun", "github.com/pressly/goose/v3"} {
		if !strings.Contains(strings.Join(blocks, "\n"), `"`+lib+`"`) {
			t.Errorf("no Go block of the database/sql section imports %s", lib)
		}
	}
	files := map[string]string{}
	for i, src := range blocks {
		if !strings.HasPrefix(src, "package ") {
			t.Fatalf("Go block %d of the database/sql section must be a complete file starting with \"package\"; it starts with %.40q", i+1, src)
		}
		files[fmt.Sprintf("tenantdb/tenantsql/internal/readme%d/example.go", i+1)] = src
	}
	doctest.Build(t, "the database/sql snippets", files)
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

// goTool finds the go command; go test puts its own toolchain's first on PATH.
func goTool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("go")
	if err != nil {
		t.Fatal("no go command:", err)
	}
	return p
}
