package tenantdb_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
	return pgxConfigOn(t, pg.DSN, maxConns)
}

// pgxConfigOn is a pgxpool.Config of maxConns connections to dsn (a role's
// of pgtest.AppRole, a PgBouncer's).
func pgxConfigOn(t testing.TB, dsn string, maxConns int32) *pgxpool.Config {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = maxConns
	return pcfg
}

func rawPool(t testing.TB, pg *tenantdbtest.Postgres, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return rawPoolOn(t, pg.DSN, maxConns)
}

// rawPoolOn is a pgxpool on dsn, closed at the end of the test.
func rawPoolOn(t testing.TB, dsn string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.NewWithConfig(context.Background(), pgxConfigOn(t, dsn, maxConns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// adminConn is a connection to dsn, closed at the end of the test.
func adminConn(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(ctx) })
	return admin
}

// databaseCreator returns create, which runs sql (a CREATE DATABASE of name)
// on admin's server unless name exists there, and reports whether it ran
// it: a server named by TENANTDB_POSTGRES_DSN may have it from a run before.
func databaseCreator(t testing.TB, admin *pgx.Conn) (create func(name, sql string) bool) {
	t.Helper()
	ctx := context.Background()
	rows, _ := admin.Query(ctx, "select datname from pg_database")
	have, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return func(name, sql string) bool {
		t.Helper()
		if slices.Contains(have, name) {
			return false
		}
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
		have = append(have, name)
		return true
	}
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
