package tenantdb_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// An HTTP handler puts the tenant from its authentication into the context,
// and turns an over-limit error into 429 Too Many Requests with Retry-After.
func Example_httpHandler() {
	pgxCfg, _ := pgxpool.ParseConfig("postgres://app@127.0.0.1:5432/app") // connects lazily
	pgxCfg.MaxConns = 20
	p, err := tenantdb.New(context.Background(), pgxCfg, tenantdb.Config{
		Plans: map[string]tenantdb.Plan{
			"free":       {MaxConns: 2},
			"standard":   {MaxConns: 10, MaxWaiting: 5, MaxWait: 100 * time.Millisecond},
			"enterprise": {MaxConns: 10, Weight: 5, ReservedConns: 4},
		},
		DefaultPlan: "free",
	})
	if err != nil {
		panic(err)
	}
	defer p.Close()

	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := tenantdb.WithTenant(r.Context(), r.Header.Get("X-Tenant")) // from your auth
		var n int
		if err := p.QueryRow(ctx, "select count(*) from orders").Scan(&n); err != nil {
			if tenantdb.WriteOverLimit(w, err) {
				return // 429 with Retry-After
			}
			http.Error(w, "database error", http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, n)
	})

	// acme is on the free plan: hold both its connections, then ask for a third.
	ctx := tenantdb.WithTenant(context.Background(), "acme")
	held := []func(){}
	for range 2 {
		permit, _ := p.Gate().Acquire(ctx, "acme")
		held = append(held, permit.Release)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/orders", nil)
	req.Header.Set("X-Tenant", "acme")
	handler.ServeHTTP(rec, req)
	fmt.Println(rec.Code, rec.Header().Get("Retry-After"))
	for _, release := range held {
		release()
	}
	// Output: 429 1
}

// With Session, each connection is set up for the tenant that acquires it,
// so PostgreSQL's row-level security policies filter every query. Connect as
// a role without SUPERUSER or BYPASSRLS, and give the tables a policy:
//
//	alter table orders enable row level security;
//	alter table orders force row level security;
//	create policy tenant_isolation on orders
//		using (tenant_id = current_setting('app.tenant_id', true));
func ExampleSession() {
	pgxCfg, _ := pgxpool.ParseConfig("postgres://app@127.0.0.1:5432/app")
	p, err := tenantdb.New(context.Background(), pgxCfg, tenantdb.Config{
		Session: tenantdb.Session{
			TenantSetting: "app.tenant_id",
			// Optional: a schema per tenant, then the shared tables.
			SearchPath: func(id string) []string { return []string{"tenant_" + id, "public"} },
		},
	})
	if err != nil {
		panic(err)
	}
	defer p.Close()

	// Sees acme's orders only, whichever connection it gets.
	var n int
	_ = p.QueryRow(tenantdb.WithTenant(context.Background(), "acme"), "select count(*) from orders").Scan(&n)
}

// A tenant's import runs as its batch class: at most 6 of its 10
// connections, queued up to 1,000 statements deep, and all tenants' batch
// work at most three quarters of the shared pool, so the tenant's users
// keep at least 4 connections and find free ones in the pool. A small plan
// sets its own batch cap.
func ExampleWithClass() {
	pgxCfg, _ := pgxpool.ParseConfig("postgres://app@127.0.0.1:5432/app") // connects lazily
	pgxCfg.MaxConns = 20
	p, err := tenantdb.New(context.Background(), pgxCfg, tenantdb.Config{
		Plans: map[string]tenantdb.Plan{
			"standard": {MaxConns: 10},
			"free":     {MaxConns: 2, ClassConns: map[string]int{"batch": 1}},
		},
		DefaultPlan: "standard",
		Classes: map[string]tenantdb.Class{
			"batch": {MaxConns: 6, MaxShare: 0.75, MaxWaiting: 1000, MaxWait: time.Minute},
		},
	})
	if err != nil {
		panic(err)
	}
	defer p.Close()

	ctx := tenantdb.WithTenant(context.Background(), "acme")
	importCtx := tenantdb.WithClass(ctx, "batch")
	_, _ = p.Exec(importCtx, "select 1") // takes one of acme's 6 batch slots (and fails here: no server)
	fmt.Println(p.TenantStat("acme").Classes[1].Class, p.TenantStat("acme").Classes[1].Limit)

	_, err = p.Exec(tenantdb.WithClass(ctx, "bulk"), "select 1")
	fmt.Println(errors.Is(err, tenantdb.ErrUnknownClass))
	// Output:
	// batch 6
	// true
}
