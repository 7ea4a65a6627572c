package tenantgrpc_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPgxUsersDoNotLinkGRPC: tenantdb and pool do not depend on this
// package or on gRPC, so a program using the pgx API does not link it.
func TestPgxUsersDoNotLinkGRPC(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goCmd, "list", "-deps", "./tenantdb", "./pool/...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.Contains(pkg, "google.golang.org/grpc") || strings.HasSuffix(pkg, "/tenantgrpc") {
			t.Fatalf("tenantdb or pool depends on %s", pkg)
		}
	}
}
