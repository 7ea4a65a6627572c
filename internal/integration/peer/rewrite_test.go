// Package peer runs pgx's own pgxpool tests against tenantdb.Pool: it copies
// them from the module cache at the pgx version of the library's go.mod,
// rewrites them mechanically (the pgxpool constructors become tenantdb.New,
// every context carries a tenant, *pgxpool.Conn becomes tenantdb.Conn) and
// runs them beside the unported suite on the same server. Nothing of pgx's is
// committed: the copy lives in a temporary directory.
package peer

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// pgmockImport is the internal package the tests use; outside pgx's module it
// is copied into the generated module under this path.
const (
	pgmockImport = `"github.com/jackc/pgx/v5/internal/pgmock"`
	peerModule   = "tenantdbpeer"
	pgmockCopy   = `"` + peerModule + `/internal/pgmock"`
)

// rewrites turn pgx's pgxpool tests into tests of tenantdb.Pool; each is
// applied to every test file of the ported package, in order.
var rewrites = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`\bpgxpool\.NewWithConfig\(`), "peerNewWithConfig("},
	{regexp.MustCompile(`\bpgxpool\.New\(`), "peerNew("},
	{regexp.MustCompile(`\bcontext\.Background\(\)`), "peerContext()"},
	{regexp.MustCompile(`\*pgxpool\.Conn\b`), "peerConn"},
	// A tenantdb.Conn is a value: a zero one is what a nil *pgxpool.Conn was.
	{regexp.MustCompile(`\b(require|assert)\.(Nil|NotNil)\(t, ([\w.]+)\)`), "$1.$2(t, peerNil($3))"},
}

// nilConnCheck is a nil check of a *pgxpool.Conn before its Release.
var nilConnCheck = regexp.MustCompile(`if (\w+) != nil \{(\s+)(\w+)\.Release\(\)`)

// helpers is the file the ported package gets beside pgx's tests: the
// constructors and the context the rewrites call. TENANTDB_PEER_TENANTS=rotate
// gives every call a different tenant (of three), so that connections change
// tenants between statements; anything else, one tenant throughout.
const helpers = `package pgxpool_test

import (
	"context"
	"os"
	"strconv"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
)

type peerConn = tenantdb.Conn

// peerNil is x, but nil for a zero (never acquired) tenantdb.Conn.
func peerNil(x any) any {
	if c, ok := x.(peerConn); ok && c.Conn() == nil {
		return nil
	}
	return x
}

// peerNewWithConfig is tenantdb.New with one plan for every tenant: the
// pool's MaxConns each, and an unbounded queue, as pgxpool's.
func peerNewWithConfig(ctx context.Context, cfg *pgxpool.Config) (*tenantdb.Pool, error) {
	plan := tenantdb.Plan{MaxWaiting: tenantdb.Unbounded}
	if cfg != nil {
		plan.MaxConns = int(cfg.MaxConns)
	}
	return tenantdb.New(ctx, cfg, tenantdb.Config{Plans: map[string]tenantdb.Plan{"peer": plan}})
}

func peerNew(ctx context.Context, connString string) (*tenantdb.Pool, error) {
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	return peerNewWithConfig(ctx, cfg)
}

const rotateMarker = "peer-rotate"

var (
	rotate   = os.Getenv("TENANTDB_PEER_TENANTS") == "rotate"
	rotation atomic.Uint64
)

// peerContext is context.Background() with a tenant.
func peerContext() context.Context {
	if rotate {
		return rotating{tenantdb.WithTenant(context.Background(), rotateMarker)}
	}
	return tenantdb.WithTenant(context.Background(), "peer")
}

// rotating answers each lookup of its tenant with the next of three.
type rotating struct{ context.Context }

func (r rotating) Value(key any) any {
	v := r.Context.Value(key)
	if v == rotateMarker {
		return "peer-" + strconv.FormatUint(rotation.Add(1)%3, 10)
	}
	return v
}
`

// port rewrites one test file of pgx's pgxpool package for the ported suite.
func port(src string) string {
	for _, r := range rewrites {
		src = r.re.ReplaceAllString(src, r.with)
	}
	// tenantdb.Conn is a value: "was it acquired" is c.Conn() != nil.
	src = nilConnCheck.ReplaceAllStringFunc(src, func(m string) string {
		g := nilConnCheck.FindStringSubmatch(m)
		if g[1] != g[3] {
			return m
		}
		return "if " + g[1] + ".Conn() != nil {" + g[2] + g[1] + ".Release()"
	})
	src = strings.ReplaceAll(src, pgmockImport, pgmockCopy)
	// An import the rewrites left unused would fail the build.
	if strings.Contains(src, `"github.com/jackc/pgx/v5/pgxpool"`) && !strings.Contains(src, "pgxpool.") {
		src += "\nvar _ *pgxpool.Config\n"
	}
	if strings.Contains(src, `"context"`) && !strings.Contains(src, "context.") {
		src += "\nvar _ context.Context\n"
	}
	return src
}

// generate writes the module of the two suites into dir: plain/ holds pgx's
// tests as they are (but for the path of pgmock), ported/ the rewritten ones,
// internal/pgmock pgx's mock server. pgxDir is pgx's directory in the module
// cache, repoRoot the library's, whose go.mod gives the versions.
func generate(dir, pgxDir, pgxVersion, testifyVersion, repoRoot string) error {
	files, err := filepath.Glob(filepath.Join(pgxDir, "pgxpool", "*_test.go"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("peer: no pgxpool tests in %s: %v", pgxDir, err)
	}
	for _, sub := range []string{"plain", "ported", "internal/pgmock"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return err
		}
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		src := string(b)
		name := filepath.Base(f)
		if err := os.WriteFile(filepath.Join(dir, "plain", name), []byte(strings.ReplaceAll(src, pgmockImport, pgmockCopy)), 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "ported", name), []byte(port(src)), 0o644); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "ported", "peer_helpers_test.go"), []byte(helpers), 0o644); err != nil {
		return err
	}
	mock, err := filepath.Glob(filepath.Join(pgxDir, "internal", "pgmock", "*.go"))
	if err != nil {
		return err
	}
	for _, f := range mock {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "internal", "pgmock", filepath.Base(f)), b, 0o644); err != nil {
			return err
		}
	}
	mod := fmt.Sprintf(`module %s

go 1.26.0

require (
	github.com/jackc/pgx/v5 %s
	github.com/stretchr/testify %s
	github.com/tenantdb/tenantdb v0.0.0-00010101000000-000000000000
)

replace github.com/tenantdb/tenantdb v0.0.0-00010101000000-000000000000 => %s
`, peerModule, pgxVersion, testifyVersion, repoRoot)
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(mod), 0o644); err != nil {
		return err
	}
	// go.sum: the library's and this module's (testify) hashes.
	var sum []byte
	for _, f := range []string{filepath.Join(repoRoot, "go.sum"), filepath.Join(repoRoot, "internal", "integration", "go.sum")} {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		sum = append(sum, b...)
	}
	return os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644)
}
