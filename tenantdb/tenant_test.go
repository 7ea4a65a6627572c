package tenantdb_test

import (
	"errors"
	"testing"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb"
)

// TestErrNoTenantIsPools: tenantdb's name for a missing tenant is the one
// sentinel every adapter matches (see tenantgrpc's TestOneErrNoTenant).
func TestErrNoTenantIsPools(t *testing.T) {
	if !errors.Is(tenantdb.ErrNoTenant, pool.ErrNoTenant) || !errors.Is(pool.ErrNoTenant, tenantdb.ErrNoTenant) {
		t.Fatalf("tenantdb.ErrNoTenant %v and pool.ErrNoTenant %v do not match each other", tenantdb.ErrNoTenant, pool.ErrNoTenant)
	}
}
