package pool_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestPoolLinksTheStandardLibraryOnly: a program that uses pool and
// poolhttp alone links no package outside the standard library and them.
func TestPoolLinksTheStandardLibraryOnly(t *testing.T) {
	gocmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to list the dependencies with")
	}
	cmd := exec.Command(gocmd, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}",
		"github.com/tenantdb/tenantdb/pool", "github.com/tenantdb/tenantdb/pool/poolhttp")
	cmd.Env = append(os.Environ(), "GOPROXY=off")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	got := strings.Fields(string(out))
	if len(got) == 0 {
		t.Fatal("go list listed nothing, not even pool")
	}
	for _, pkg := range got {
		if pkg != "github.com/tenantdb/tenantdb/pool" && pkg != "github.com/tenantdb/tenantdb/pool/poolhttp" {
			t.Errorf("pool or poolhttp links %s, beyond the standard library", pkg)
		}
	}
}
