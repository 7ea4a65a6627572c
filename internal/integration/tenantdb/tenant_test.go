package tenantdb_test

import (
	"context"
	"testing"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/tenantdb"
)

// TestOneTenantKey proves that tenantdb and pool share the context key: a
// tenant set by an adapter on pool (poolhttp, the gRPC interceptors) is the
// one tenantdb admits, and the other way round.
func TestOneTenantKey(t *testing.T) {
	ctx := context.Background()
	if id, ok := tenantdb.TenantFrom(pool.WithTenant(ctx, "acme")); !ok || id != "acme" {
		t.Fatalf("tenantdb.TenantFrom(pool.WithTenant) = %q, %v", id, ok)
	}
	if id, ok := pool.TenantFrom(tenantdb.WithTenant(ctx, "acme")); !ok || id != "acme" {
		t.Fatalf("pool.TenantFrom(tenantdb.WithTenant) = %q, %v", id, ok)
	}
	if id, ok := tenantdb.TenantFrom(pool.WithoutTenant(tenantdb.WithTenant(ctx, "acme"))); ok {
		t.Fatalf("pool.WithoutTenant left %q visible to tenantdb", id)
	}
}
