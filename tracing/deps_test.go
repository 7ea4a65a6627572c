package tracing_test

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// maxInstrumentedModules bounds the modules, the main one included, linked
// by a program that calls tenantdb.New with tracing.New() (testdata/instrumented).
const maxInstrumentedModules = 15

// goListDeps returns each package pkgs link, with its module path (empty for
// the standard library), as go list -deps reports them. It lists offline:
// everything needed is already in the module cache when this test compiles.
func goListDeps(t *testing.T, pkgs ...string) [][2]string {
	t.Helper()
	gocmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the dependencies with")
	}
	args := append([]string{"list", "-deps", "-f", "{{.ImportPath}} {{with .Module}}{{.Path}}{{end}}"}, pkgs...)
	cmd := exec.Command(gocmd, args...)
	cmd.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=-mod=readonly")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v", pkgs, err)
	}
	var deps [][2]string
	for line := range strings.Lines(strings.TrimSpace(string(out))) {
		pkg, mod, _ := strings.Cut(strings.TrimSpace(line), " ")
		deps = append(deps, [2]string{pkg, mod})
	}
	return deps
}

// TestInstrumentationLinksTheAPIOnly lists what package tracing (its
// non-test files) links, with the go command: no OpenTelemetry SDK, no
// exporter, no gRPC, protobuf or Prometheus client, which belong to
// package otelsetup; and no module beyond pgx's, the OpenTelemetry API's
// (otel's root package, whose global providers New uses by default, brings
// logr, stdr, auto/sdk and otel/log) and theirs, so that a program that only
// instruments stays small.
func TestInstrumentationLinksTheAPIOnly(t *testing.T) {
	deps := goListDeps(t, "github.com/tenantdb/tenantdb/tracing")
	forbidden := []string{
		"go.opentelemetry.io/otel/sdk",
		"go.opentelemetry.io/otel/exporters",
		"google.golang.org/grpc",
		"google.golang.org/protobuf",
		"github.com/prometheus/",
	}
	allowed := []string{
		"github.com/tenantdb/tenantdb",
		// pgx and what it needs
		"github.com/jackc/pgx/v5", "github.com/jackc/pgpassfile", "github.com/jackc/pgservicefile",
		"github.com/jackc/puddle/v2", "golang.org/x/sync", "golang.org/x/text",
		// the OpenTelemetry API (attribute, semconv, metric, trace and their no-op providers)
		"go.opentelemetry.io/otel", "go.opentelemetry.io/otel/metric", "go.opentelemetry.io/otel/trace",
		"github.com/cespare/xxhash/v2",
		// what otel's global providers (package otel) bring
		"github.com/go-logr/logr", "github.com/go-logr/stdr", "go.opentelemetry.io/auto/sdk", "go.opentelemetry.io/otel/log",
	}
	modules := map[string]bool{}
	for _, d := range deps {
		pkg, mod := d[0], d[1]
		for _, f := range forbidden {
			if strings.HasPrefix(pkg, f) {
				t.Errorf("tracing links %s (module %s): exporter and SDK setup belong to tracing/otelsetup", pkg, mod)
			}
		}
		if mod != "" && !modules[mod] {
			modules[mod] = true
			if !slices.Contains(allowed, mod) {
				t.Errorf("tracing links module %s (package %s), beyond pgx and the OpenTelemetry API", mod, pkg)
			}
		}
	}
	if len(modules) < 3 {
		t.Fatalf("go list found %d modules, fewer than tracing itself needs: %v", len(modules), deps)
	}
	t.Logf("tracing links %d modules, its own included", len(modules))
}

// TestInstrumentedProgramModules counts the modules that a program calling
// tenantdb.New with tracing.New() links, its own included, and holds the
// count to maxInstrumentedModules.
func TestInstrumentedProgramModules(t *testing.T) {
	deps := goListDeps(t, "./testdata/instrumented")
	var modules []string
	for _, d := range deps {
		if mod := d[1]; mod != "" && !slices.Contains(modules, mod) {
			modules = append(modules, mod)
		}
	}
	if !slices.Contains(modules, "github.com/jackc/pgx/v5") || !slices.Contains(modules, "go.opentelemetry.io/otel/trace") {
		t.Fatalf("go list missed pgx or the OpenTelemetry API, so it listed something else: %v", modules)
	}
	if len(modules) > maxInstrumentedModules {
		t.Errorf("the instrumented program links %d modules, more than %d: %v", len(modules), maxInstrumentedModules, modules)
	}
	t.Logf("the instrumented program links %d modules, its own included: %v", len(modules), modules)
}
