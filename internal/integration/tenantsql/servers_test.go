package tenantsql_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// TestServersThroughDatabaseSQL: with tenantdb.NewServers, database/sql's
// statements run where the tenant's placement says: here two servers
// (the test's one PostgreSQL under two names, each tenant in a database of
// its own) and a tenant without a placement, which fails closed.
func TestServersThroughDatabaseSQL(t *testing.T) {
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, sharedPG.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	for _, db := range []string{"sql_srv_a", "sql_srv_b"} {
		if _, err := admin.Exec(ctx, "drop database if exists "+db+" with (force)"); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(ctx, "create database "+db); err != nil {
			t.Fatal(err)
		}
	}
	servers := map[string]*pgxpool.Config{}
	for _, name := range []string{"s0", "s1"} {
		c, err := pgxpool.ParseConfig(sharedPG.DSN)
		if err != nil {
			t.Fatal(err)
		}
		c.MaxConns = 2
		servers[name] = c
	}
	at := map[string]tenantdb.Placement{"a": {Server: "s0", Database: "sql_srv_a"}, "b": {Server: "s1", Database: "sql_srv_b"}}
	p, err := tenantdb.NewServers(ctx, servers, tenantdb.Config{
		Placement: func(_ context.Context, id string) (tenantdb.Placement, error) {
			if pl, ok := at[id]; ok {
				return pl, nil
			}
			return tenantdb.Placement{}, errors.New("not in the directory")
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	db := openDB(t, p)
	for tenant, want := range at {
		var got string
		if err := db.QueryRowContext(as(tenant), "select current_database()").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want.Database {
			t.Errorf("%s's statement ran in %s, want %s", tenant, got, want.Database)
		}
	}
	if err := db.QueryRowContext(as("c"), "select 1").Scan(new(int)); !errors.Is(err, tenantdb.ErrNoPlacement) {
		t.Errorf("a tenant without a placement: %v, want ErrNoPlacement", err)
	}
	for _, s := range p.ServersStat() {
		if s.Open != 1 || s.InUse != 0 {
			t.Errorf("server %s: %+v, want one connection open and nothing in use", s.Server, s)
		}
	}
}
