package tracing_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tenantdb/tenantdb/internal/doctest"
)

// maxConsumerModules bounds the build list (go list -m all), its own module
// included, of a fresh module whose program imports tenantdb and tracing:
// every requirement of our go.mod enters it, indirect and test-only ones
// too, so a heavy dependency added to the root module shows here.
const maxConsumerModules = 30

// TestConsumerModuleGraph makes the module a new user would: the program of
// testdata/instrumented, this repository as github.com/tenantdb/tenantdb
// (a replace, outside the workspace), go mod tidy, then go list -m all. It
// uses the module cache alone when that has everything (the build of this
// package put most of it there) and the configured proxy otherwise.
func TestConsumerModuleGraph(t *testing.T) {
	gocmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the module graph with")
	}
	root := doctest.Root(t)
	prog, err := os.ReadFile(filepath.Join("testdata", "instrumented", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gomod := "module example.com/consumer\n\ngo 1.26.0\n\nreplace github.com/tenantdb/tenantdb => " + root + "\n"
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), prog, 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(proxy string, args ...string) (string, error) {
		cmd := exec.Command(gocmd, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		if proxy != "" {
			cmd.Env = append(cmd.Env, "GOPROXY="+proxy)
		}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run("off", "mod", "tidy"); err != nil {
		t.Logf("go mod tidy from the module cache alone: %v\n%s", err, out)
		if out, err := run("", "mod", "tidy"); err != nil {
			t.Fatalf("go mod tidy: %v\n%s", err, out)
		}
	}
	out, err := run("off", "list", "-m", "all")
	if err != nil {
		// The graph names modules whose go.mod no build needed (a fresh
		// module cache lacks them).
		t.Logf("go list -m all from the module cache alone: %v\n%s", err, out)
		if out, err = run("", "list", "-m", "all"); err != nil {
			t.Fatalf("go list -m all: %v\n%s", err, out)
		}
	}
	var paths []string
	for line := range strings.Lines(strings.TrimSpace(out)) {
		paths = append(paths, strings.Fields(line)[0])
	}
	if !strings.Contains(out, "github.com/jackc/pgx/v5 ") || !strings.Contains(out, "go.opentelemetry.io/otel/trace ") {
		t.Fatalf("the build list lacks pgx or the OpenTelemetry API, so it is not the consumer's:\n%s", out)
	}
	if len(paths) > maxConsumerModules {
		t.Errorf("a module importing tenantdb and tracing has %d modules in its build list, more than %d: a dependency of the root go.mod (a test's included) belongs in a module of its own (docs/modules.md):\n%s", len(paths), maxConsumerModules, out)
	}
	t.Logf("a module importing tenantdb and tracing has %d modules in its build list", len(paths))
}
