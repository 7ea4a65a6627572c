package tenantsql_test

import (
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// The benchmarks run "select 1" through database/sql on one shared pgxpool
// of 8 connections, so that their difference is what each layer adds:
//
//	IdleReuse        database/sql keeping idle connections (no tenants; what tenantsql gives up)
//	OpenDBFromPool   pgx's stdlib.OpenDBFromPool: no idle connections, no tenants
//	TenantSQL        tenantsql.OpenDB: no idle connections, a tenant slot per connection
//	PgxAPI           the tenantdb.Pool's own QueryRow, for reference
//
// go test ./tenantdb/tenantsql -run '^$' -bench Select1 -benchmem -benchtime 2000x -count 5
func benchDBs(b *testing.B) (*tenantdb.Pool, map[string]*sql.DB) {
	p := newPool(b, "", 8, tenantdb.Plan{MaxConns: 8}, tenantdb.Session{})
	idle := sql.OpenDB(stdlib.GetPoolConnector(p.Pgxpool()))
	idle.SetMaxIdleConns(8)
	dbs := map[string]*sql.DB{
		"IdleReuse":      idle,
		"OpenDBFromPool": stdlib.OpenDBFromPool(p.Pgxpool()),
		"TenantSQL":      openDB(b, p),
	}
	for _, db := range dbs {
		b.Cleanup(func() { db.Close() })
	}
	return p, dbs
}

func BenchmarkSelect1(b *testing.B) {
	p, dbs := benchDBs(b)
	ctx := as("bench")
	for _, name := range []string{"IdleReuse", "OpenDBFromPool", "TenantSQL"} {
		db := dbs[name]
		b.Run(name, func(b *testing.B) {
			var n int
			for b.Loop() {
				if err := db.QueryRowContext(ctx, "select 1").Scan(&n); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/Parallel", func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				var n int
				for pb.Next() {
					if err := db.QueryRowContext(ctx, "select 1").Scan(&n); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
	b.Run("PgxAPI", func(b *testing.B) {
		var n int
		for b.Loop() {
			if err := p.QueryRow(ctx, "select 1").Scan(&n); err != nil {
				b.Fatal(err)
			}
		}
	})
}
