package pool_test

import (
	"context"
	"testing"

	"github.com/tenantdb/tenantdb/pool"
)

func TestTenantContext(t *testing.T) {
	ctx := context.Background()
	if id, ok := pool.TenantFrom(ctx); ok || id != "" {
		t.Fatalf("empty context carries %q", id)
	}
	if pool.WithoutTenant(ctx) != ctx {
		t.Fatal("WithoutTenant wrapped a context that carries no tenant")
	}
	acme := pool.WithTenant(ctx, "acme")
	if id, ok := pool.TenantFrom(acme); !ok || id != "acme" {
		t.Fatalf("TenantFrom = %q, %v; want acme, true", id, ok)
	}
	if id, ok := pool.TenantFrom(pool.WithTenant(acme, "")); !ok || id != "" {
		t.Fatalf("an empty tenant set explicitly reads %q, %v; want \"\", true (the Gate rejects it)", id, ok)
	}
	if id, ok := pool.TenantFrom(pool.WithoutTenant(acme)); ok {
		t.Fatalf("WithoutTenant still carries %q", id)
	}
	if id, ok := pool.TenantFrom(pool.WithTenant(pool.WithoutTenant(acme), "b")); !ok || id != "b" {
		t.Fatalf("a tenant set under a hidden one reads %q, %v", id, ok)
	}
}
