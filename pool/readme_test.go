package pool_test

import (
	"testing"

	"github.com/tenantdb/tenantdb/internal/readmetest"
)

// TestReadmeRunner builds the README's Runner example as the complete
// program it claims to be.
func TestReadmeRunner(t *testing.T) {
	readmetest.Build(t, readmetest.Program(t, "### Background jobs: `pool.Runner`"))
}
