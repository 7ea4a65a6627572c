package tenantdb_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// TestHealthCheckPing: a Ping without a tenant passes while a tenant is at
// its cap and takes no tenant slot, but still waits for a shared connection.
func TestHealthCheckPing(t *testing.T) {
	p := newPool(t, sharedPG, 2, tenantdb.Config{Plans: map[string]tenantdb.Plan{"std": {MaxConns: 1}}})
	tx, err := p.Begin(as("acme")) // acme at its cap of 1
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Ping(as("acme")); !errors.Is(err, tenantdb.ErrOverLimit) {
		t.Fatalf("acme's Ping at its cap: err = %v, want ErrOverLimit", err)
	}
	before := p.Stat().Tenants
	if err := p.Ping(context.Background()); err != nil {
		t.Fatalf("health check while a tenant is at its cap: %v", err)
	}
	if after := p.Stat().Tenants; after.Acquired != before.Acquired || after.Rejected != before.Rejected || after.Tenants != before.Tenants {
		t.Fatalf("the health check went through the tenant gate: %+v, then %+v", before, after)
	}

	// Both shared connections taken: the health check waits like everyone.
	other, err := p.Begin(as("globex"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := p.Ping(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("health check past MaxConns: err = %v, want DeadlineExceeded", err)
	}
	_ = other.Rollback(context.Background())
	_ = tx.Rollback(context.Background())
	if err := p.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := p.Ping(tenantdb.WithTenant(context.Background(), "")); !errors.Is(err, tenantdb.ErrNoTenant) {
		t.Fatalf("Ping with an empty tenant: err = %v, want ErrNoTenant", err)
	}
	assertNothingHeld(t, p)
}

// TestAcquireAllIdle: the idle connections come without tenant slots and,
// with Session, with the defaults, whatever tenant ctx names.
func TestAcquireAllIdle(t *testing.T) {
	dsn := setupRLS(t)
	p := newRLSPool(t, dsn, 3, nil)
	// Open three connections, each last held by a tenant (plan cap 1 each).
	var held []tenantdb.Conn
	for _, tenant := range []string{"a", "b", "c"} {
		c, err := p.Acquire(as(tenant))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	for _, c := range held {
		c.Release()
	}
	eventually(t, "the three connections are reset and idle", func() bool { return p.Stat().IdleConns() == 3 })

	conns := p.AcquireAllIdle(as("a"))
	if len(conns) != 3 {
		t.Fatalf("AcquireAllIdle returned %d connections, want the 3 idle ones", len(conns))
	}
	if s := p.TenantStat("a"); s.InUse != 0 {
		t.Fatalf("AcquireAllIdle took %d of a's slots, want none", s.InUse)
	}
	if n := p.Stat().AcquiredConns(); n != 3 {
		t.Fatalf("pgxpool counts %d acquired, want 3", n)
	}
	for _, c := range conns {
		var tenants []string
		var setting string
		err := c.QueryRow(context.Background(),
			"select array(select tenant from rls_docs), current_setting('app.tenant_id', true)").Scan(&tenants, &setting)
		if err != nil {
			t.Fatal(err)
		}
		if len(tenants) != 0 || setting != "" {
			t.Fatalf("an idle connection came with rows of %v and app.tenant_id %q; want none", tenants, setting)
		}
	}
	// A tenant's call waits for a connection while they are held.
	ctx, cancel := context.WithTimeout(as("b"), 100*time.Millisecond)
	defer cancel()
	if _, err := p.Exec(ctx, "select 1"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Exec while every connection is held for maintenance: err = %v, want DeadlineExceeded", err)
	}
	for _, c := range conns {
		c.Release()
		c.Release() // idempotent
	}
	assertNothingHeld(t, p)
	var n int
	if err := pgx.BeginFunc(as("b"), p, func(tx pgx.Tx) error { return tx.QueryRow(as("b"), "select count(*) from rls_docs").Scan(&n) }); err != nil || n != 1 {
		t.Fatalf("b after maintenance: %d rows, %v", n, err)
	}
}
