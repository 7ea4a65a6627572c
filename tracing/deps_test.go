package tracing_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestInstrumentationLinksTheAPIOnly lists what package tracing (its
// non-test files) links, with the go command: no OpenTelemetry SDK, no
// exporter, no gRPC, protobuf or Prometheus client, which belong to
// package otelsetup; and no module beyond pgx's, the OpenTelemetry API's
// and theirs, so that a program that only instruments stays small.
func TestInstrumentationLinksTheAPIOnly(t *testing.T) {
	gocmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the dependencies with")
	}
	out, err := exec.Command(gocmd, "list", "-deps", "-f",
		"{{.ImportPath}} {{with .Module}}{{.Path}}{{end}}", "github.com/tenantdb/tenantdb/tracing").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
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
		// the OpenTelemetry API, and what its global providers need
		"go.opentelemetry.io/otel", "go.opentelemetry.io/otel/metric", "go.opentelemetry.io/otel/trace",
		"go.opentelemetry.io/otel/log", "go.opentelemetry.io/auto/sdk",
		"github.com/cespare/xxhash/v2", "github.com/go-logr/logr", "github.com/go-logr/stdr",
	}
	modules := map[string]bool{}
	for line := range strings.Lines(strings.TrimSpace(string(out))) {
		pkg, mod, _ := strings.Cut(strings.TrimSpace(line), " ")
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
		t.Fatalf("go list found %d modules, fewer than tracing itself needs: %s", len(modules), out)
	}
	t.Logf("tracing links %d modules, its own included", len(modules))
}
