package tenantgrpc_test

import (
	"testing"

	"github.com/tenantdb/tenantdb/internal/doctest"
)

// TestReadmeGRPC builds the documented gRPC example as the complete program
// it claims to be.
func TestReadmeGRPC(t *testing.T) {
	doctest.BuildProgram(t, "### gRPC: `tenantgrpc` interceptors", "tenantdb/tenantgrpc/internal/readme")
}
