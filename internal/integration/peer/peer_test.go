package peer

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// byDesign are the pgx tests that fail on tenantdb.Pool for a reason that is
// part of its design, with the reason. A test listed here that passes is
// reported, so that the list does not outlive its reasons.
var byDesign = map[string]string{
	"TestPoolAcquireCanceledDuringStalledPing": "its fake server (pgmock) expects exactly pgxpool's messages on a new " +
		"connection and leaves the first query after startup, pgxpool's ping, unanswered; on tenantdb that query is " +
		"the check of the role's defaults in AfterConnect (roledefaults.go), so the cancelled acquire ends while " +
		"connecting, with no connection acquired, not during the ping",
	"TestTxBeginFuncNestedTransactionCommit": "it creates a temporary table with one pool statement and uses it in " +
		"the next: tenantdb resets a session at release, as PgBouncer does between clients (DISCARD TEMP drops " +
		"temporary tables), unless calls wait for a connection or one tenant took the last acquires, and the same " +
		"tenant takes it next",
	"TestTxBeginFuncNestedTransactionRollback": "as TestTxBeginFuncNestedTransactionCommit",
}

// byDesignWhenSlow are the pgx tests that fail by design only when the
// machine is slow enough to lose a race they do not know they run: they pass
// on an idle machine, so passing is not reported.
var byDesignWhenSlow = map[string]string{
	"TestPoolAcquireChecksIdleConns": "it reads pgx's PID through Conn.Conn(), which gives a holder raw access, so " +
		"tenantdb resets the session at release, in a goroutine as pgxpool runs AfterRelease; it then terminates " +
		"the three backends and expects the pool to count them all until an acquire finds them dead: a reset still " +
		"running when its backend is terminated fails, and pgxpool destroys that connection at once (seen only " +
		"with the machine busy, in the loaded runs of issue 44)",
}

// byDesignRotating are the pgx tests that fail by design only when tenants
// change between statements.
var byDesignRotating = map[string]string{}

// outcome is what go test -json said of one test.
type outcome struct {
	action string // pass, fail or skip
	output strings.Builder
}

// suiteRun is one run of a suite: each test's outcome by name (subtests as
// Test/sub).
type suiteRun map[string]*outcome

// count is how many top-level tests ended with action, and how many subtests.
func (r suiteRun) count(action string) string {
	tests, subtests := 0, 0
	for name, o := range r {
		switch {
		case o.action != action:
		case strings.Contains(name, "/"):
			subtests++
		default:
			tests++
		}
	}
	return fmt.Sprintf("%d (+%d subtests)", tests, subtests)
}

// tests is how many top-level tests ran.
func (r suiteRun) tests() int {
	n := 0
	for name := range r {
		if !strings.Contains(name, "/") {
			n++
		}
	}
	return n
}

// TestPgxpoolSuite runs pgx's pgxpool tests, at the version of the library's
// go.mod, on plain pgxpool and on tenantdb.Pool (one tenant; then tenants
// changing between statements) against one PostgreSQL, and fails on every
// test that fails on tenantdb.Pool but not on pgxpool, unless byDesign or byDesignWhenSlow lists
// it.
func TestPgxpoolSuite(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs pgx's pgxpool tests three times")
	}
	repoRoot, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	pgx := goList(t, repoRoot, "github.com/jackc/pgx/v5")
	testify := goList(t, filepath.Join(repoRoot, "internal", "integration"), "github.com/stretchr/testify")
	dir := t.TempDir()
	if err := generate(dir, pgx.dir, pgx.version, testify.version, repoRoot); err != nil {
		t.Fatal(err)
	}
	t.Logf("pgx %s's pgxpool tests, testify %s, in %s", pgx.version, testify.version, dir)

	pg := tenantdbtest.StartPostgres(t)
	plain := runSuite(t, dir, "./plain/", pg.DSN, "")
	t.Logf("plain pgxpool: %s passed, %s failed, %s skipped", plain.count("pass"), plain.count("fail"), plain.count("skip"))
	for _, mode := range []string{"one", "rotate"} {
		ported := runSuite(t, dir, "./ported/", pg.DSN, mode)
		t.Logf("tenantdb.Pool, tenants %s: %s passed, %s failed, %s skipped (of %d tests)",
			mode, ported.count("pass"), ported.count("fail"), ported.count("skip"), plain.tests())
		compare(t, mode, plain, ported)
	}
}

// compare fails t on each test that fails in ported but not in plain and is
// not byDesign.
func compare(t *testing.T, mode string, plain, ported suiteRun) {
	t.Helper()
	names := make([]string, 0, len(ported))
	for name := range ported {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		o := ported[name]
		if o.action != "fail" {
			continue
		}
		top := strings.SplitN(name, "/", 2)[0]
		if reason, ok := byDesign[top]; ok {
			t.Logf("tenants %s: %s fails by design: %s", mode, name, reason)
			continue
		}
		if reason, ok := byDesignRotating[top]; ok && mode == "rotate" {
			t.Logf("tenants %s: %s fails by design: %s", mode, name, reason)
			continue
		}
		if reason, ok := byDesignWhenSlow[top]; ok {
			t.Logf("tenants %s: %s fails by design with the machine busy: %s", mode, name, reason)
			continue
		}
		if p, ok := plain[name]; ok && p.action == "fail" {
			t.Logf("tenants %s: %s fails on plain pgxpool too", mode, name)
			continue
		}
		t.Errorf("tenants %s: %s fails on tenantdb.Pool, not on pgxpool:\n%s", mode, name, o.output.String())
	}
	for name := range byDesign {
		if o, ok := ported[name]; ok && o.action == "pass" {
			t.Logf("tenants %s: %s is listed as failing by design but passes: take it off byDesign", mode, name)
		}
	}
	for name := range byDesignRotating {
		if o, ok := ported[name]; ok && o.action == "pass" && mode == "rotate" {
			t.Logf("tenants %s: %s is listed as failing by design but passes: take it off byDesign", mode, name)
		}
	}
}

type module struct{ dir, version string }

// goList returns the directory and version of module path as the go.mod in
// dir requires it.
func goList(t *testing.T, dir, path string) module {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}} {{.Version}}", path)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m %s in %s: %v", path, dir, err)
	}
	f := strings.Fields(string(out))
	if len(f) != 2 {
		t.Fatalf("go list -m %s: %q", path, out)
	}
	return module{dir: f[0], version: f[1]}
}

// runSuite runs go test -json on pkg of the generated module and collects
// each test's outcome. tenants is TENANTDB_PEER_TENANTS for the ported suite.
func runSuite(t *testing.T, dir, pkg, dsn, tenants string) suiteRun {
	t.Helper()
	args := []string{"test", "-json", "-count=1", "-timeout=20m"}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, pkg)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod",
		"PGX_TEST_DATABASE="+dsn, "TENANTDB_PEER_TENANTS="+tenants)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, runErr := cmd.Output() // fails when a test does; the outcomes say which
	run := suiteRun{}
	var packageOutput strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var ev struct{ Action, Test, Output string }
		if json.Unmarshal(sc.Bytes(), &ev) != nil {
			packageOutput.WriteString(sc.Text() + "\n")
			continue
		}
		if ev.Test == "" {
			packageOutput.WriteString(ev.Output)
			continue
		}
		o := run[ev.Test]
		if o == nil {
			o = &outcome{}
			run[ev.Test] = o
		}
		switch ev.Action {
		case "output":
			o.output.WriteString(ev.Output)
		case "pass", "fail", "skip":
			o.action = ev.Action
		}
	}
	if len(run) == 0 {
		t.Fatalf("go test %s ran no test (%v):\n%s\n%s", pkg, runErr, packageOutput.String(), stderr.String())
	}
	return run
}
