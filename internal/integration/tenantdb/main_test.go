package tenantdb_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/internal/integration/testmain"
	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
)

// sharedPG is one PostgreSQL container for the tests that do not stop it.
var sharedPG *tenantdbtest.Postgres

func TestMain(m *testing.M) { testmain.RunWithPostgres(m, &sharedPG) }

// newPool builds a tenantdb.Pool on pg with maxConns shared connections.
func newPool(t testing.TB, pg *tenantdbtest.Postgres, maxConns int32, cfg tenantdb.Config) *tenantdb.Pool {
	t.Helper()
	pcfg := pgxConfig(t, pg, maxConns)
	p, err := tenantdb.New(context.Background(), pcfg, cfg)
	if err != nil {
		t.Fatalf("tenantdb.New: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

func pgxConfig(t testing.TB, pg *tenantdbtest.Postgres, maxConns int32) *pgxpool.Config {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = maxConns
	return pcfg
}

func rawPool(t testing.TB, pg *tenantdbtest.Postgres, maxConns int32) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.NewWithConfig(context.Background(), pgxConfig(t, pg, maxConns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func as(tenant string) context.Context { return tenantdb.WithTenant(context.Background(), tenant) }

// assertNothingHeld checks that no tenant slot and no shared connection is in use.
func assertNothingHeld(t testing.TB, p *tenantdb.Pool) {
	t.Helper()
	s := p.Stat()
	if s.Tenants.InUse != 0 || s.Tenants.Waiting != 0 {
		t.Fatalf("held after the test: %d tenant slots in use, %d waiting", s.Tenants.InUse, s.Tenants.Waiting)
	}
	// pgxpool destroys broken connections in the background.
	eventually(t, "no shared connection is acquired", func() bool { return p.Stat().AcquiredConns() == 0 })
}

// eventually is tenantdbtest.Eventually with this package's deadline, which
// only matters when a test fails: a minute, long enough for a container to
// stop and start again.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	tenantdbtest.Eventually(t, time.Minute, what, cond)
}
