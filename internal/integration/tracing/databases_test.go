package tracing_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
	"github.com/tenantdb/tenantdb/tracing"
)

// TestDatabasePerTenantSpansAndMetrics: with Config.Database, a query
// span's db.namespace is the tenant's database, and ObservePool reports the
// connections of every database against the budget.
func TestDatabasePerTenantSpansAndMetrics(t *testing.T) {
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, postgres(t).DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, db := range []string{"tracing_acme", "tracing_globex"} {
		if _, err := admin.Exec(ctx, "drop database if exists "+db+" with (force)"); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(ctx, "create database "+db); err != nil {
			t.Fatal(err)
		}
	}
	e := newEnv(t, tracing.WithPoolName("orders"))
	p := newTracedPool(t, e.tr, nil, 3, tenantdb.Config{
		Database: func(id string) (string, error) { return "tracing_" + id, nil },
	})
	stop, err := e.tr.ObservePool(p)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	for _, tenant := range []string{"acme", "globex"} {
		tctx, root := e.root(tenantdb.WithTenant(ctx, tenant))
		if _, err := p.Exec(tctx, "select 1 /* "+tenant+" */"); err != nil { // leaves an idle connection
			t.Fatal(err)
		}
		root.End()
	}
	for _, tenant := range []string{"acme", "globex"} {
		found := false
		for _, s := range e.ended("SELECT tracing_" + tenant) {
			if v, ok := attr(s, tracing.TenantKey); ok && v.AsString() == tenant {
				found = true
				if got := mustAttr(t, s, semconv.DBNamespaceKey).AsString(); got != "tracing_"+tenant {
					t.Errorf("%s's span: db.namespace %q, want its database", tenant, got)
				}
			}
		}
		if !found {
			t.Errorf("no SELECT span of %s", tenant)
		}
	}
	// Each connection is back once the reset at release is done.
	tenantdbtest.Eventually(t, time.Minute, "both databases' connections are idle", func() bool {
		for _, db := range p.AppendDatabaseStat(nil) {
			if db.InUse != 0 {
				return false
			}
		}
		return true
	})
	c, err := p.Acquire(tenantdb.WithTenant(ctx, "acme"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	rm := e.collect(t)
	name := semconv.DBClientConnectionPoolName("orders")
	used := value(t, rm, "db.client.connection.count", name, semconv.DBClientConnectionStateUsed).value
	idle := value(t, rm, "db.client.connection.count", name, semconv.DBClientConnectionStateIdle).value
	if used != 1 || idle != 1 { // acme's connection in use, globex's idle
		t.Errorf("count: used %v idle %v, want 1 and 1 across the databases", used, idle)
	}
	if got := value(t, rm, "db.client.connection.max", name).value; got != 3 {
		t.Errorf("max %v, want the budget 3", got)
	}
	for db, want := range map[string][2]float64{"tracing_acme": {1, 0}, "tracing_globex": {0, 1}} {
		ns := semconv.DBNamespace(db)
		got := [2]float64{
			value(t, rm, "tenantdb.database.connection.count", name, ns, semconv.DBClientConnectionStateUsed).value,
			value(t, rm, "tenantdb.database.connection.count", name, ns, semconv.DBClientConnectionStateIdle).value,
		}
		if got != want {
			t.Errorf("%s: used and idle %v, want %v", db, got, want)
		}
	}
	if got := value(t, rm, "tenantdb.database.connection.opens", name).value; got != 2 {
		t.Errorf("opens %v, want 2", got)
	}
	if got := value(t, rm, "tenantdb.database.connection.open_time", name).value; got <= 0 {
		t.Errorf("open time %v, want some", got)
	}
}
