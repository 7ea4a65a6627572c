package tenantdb_test

import (
	"testing"

	"github.com/tenantdb/tenantdb/internal/doctest"
)

// TestReadmeQuickStartCompiles builds the README's quick start as the
// complete program it claims to be, so that the first code a user copies
// compiles against the API as it is.
func TestReadmeQuickStartCompiles(t *testing.T) {
	doctest.BuildProgram(t, "## Quick start", "tenantdb/internal/readmequickstart")
}
