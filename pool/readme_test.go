package pool_test

import (
	"testing"

	"github.com/tenantdb/tenantdb/internal/doctest"
)

// TestReadmeRunner builds the documented Runner example as the complete
// program it claims to be.
func TestReadmeRunner(t *testing.T) {
	doctest.BuildProgram(t, "### Background jobs: `pool.Runner`", "pool/internal/readme")
}
