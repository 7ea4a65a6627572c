package tenantdb_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tenantdb/tenantdb/internal/doctest"
)

// testProgram runs the program of docs/servers.md's "A complete program on
// three servers" on the three servers and checks that each tenant's
// statement ran on its server, in its database, as the servers report.
func (f *fleet) testProgram(t *testing.T) {
	const heading = "## A complete program on three servers"
	section := doctest.Section(t, heading)
	blocks := doctest.GoBlocks(t, section)
	if len(blocks) == 0 || !strings.HasPrefix(blocks[0], "package main\n") {
		t.Fatalf("docs/servers.md's %q has no complete program", heading)
	}
	root, dir := doctest.Root(t), t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte(blocks[0]), 0o644); err != nil {
		t.Fatal(err)
	}
	overlay := filepath.Join(dir, "overlay.json")
	target := filepath.Join(root, "tenantdb", "internal", "serversprogram", "main.go")
	if err := os.WriteFile(overlay, []byte(`{"Replace":{"`+target+`":"`+src+`"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, name := range f.names {
		env = append(env, name+"="+f.pgs[name].DSN)
	}
	cmd := exec.Command("go", "run", "-overlay="+overlay, "./tenantdb/internal/serversprogram")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly", "GOPROXY=off", "SERVERS="+strings.Join(env, " "))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the program failed: %v\n%s", err, out)
	}
	want := strings.Join([]string{
		"acme ran on s0 in " + f.pgs["s0"].Database,
		"globex ran on s1 in app",
		"initech ran on s2 in " + f.pgs["s2"].Database,
		"umbrella: no placement, ran nowhere",
		"s0: budget 10, 1 open",
		"s1: budget 10, 1 open",
		"s2: budget 10, 1 open",
	}, "\n")
	if got := strings.TrimSpace(string(out)); got != want {
		t.Fatalf("the program printed:\n%s\nwant:\n%s", got, want)
	}
}
