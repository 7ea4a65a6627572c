package tenantgrpc_test

import (
	"testing"

	"github.com/tenantdb/tenantdb/internal/readmetest"
)

// TestReadmeGRPC builds the README's gRPC example as the complete program
// it claims to be.
func TestReadmeGRPC(t *testing.T) {
	readmetest.Build(t, readmetest.Program(t, "### gRPC: `tenantgrpc` interceptors"))
}
