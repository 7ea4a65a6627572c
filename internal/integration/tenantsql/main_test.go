package tenantsql_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tenantdb/tenantdb/internal/integration/testmain"
	"github.com/tenantdb/tenantdb/internal/pgtest"
	"github.com/tenantdb/tenantdb/tenantdb"
	"github.com/tenantdb/tenantdb/tenantdb/tenantdbtest"
	"github.com/tenantdb/tenantdb/tenantdb/tenantsql"
)

// sharedPG is one PostgreSQL container for every test of the package.
var sharedPG *tenantdbtest.Postgres

func TestMain(m *testing.M) { testmain.RunWithPostgres(m, &sharedPG) }

func as(tenant string) context.Context { return tenantdb.WithTenant(context.Background(), tenant) }

// newPool builds a tenantdb.Pool with maxConns shared connections, every
// tenant on plan, connecting as the DSN's user (the superuser when dsn is "").
func newPool(t testing.TB, dsn string, maxConns int32, plan tenantdb.Plan, session tenantdb.Session) *tenantdb.Pool {
	t.Helper()
	if dsn == "" {
		dsn = sharedPG.DSN
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = maxConns
	p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
		Plans:   map[string]tenantdb.Plan{"std": plan},
		Session: session,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// openDB is tenantsql.OpenDB, closed at the end of the test.
func openDB(t testing.TB, p *tenantdb.Pool) *sql.DB {
	t.Helper()
	db := tenantsql.OpenDB(p)
	t.Cleanup(func() { db.Close() })
	return db
}

// inUse is the tenant's slots in use.
func inUse(p *tenantdb.Pool, tenant string) int { return p.TenantStat(tenant).InUse }

// assertReleased checks that the tenant holds no slot and that no shared
// connection is acquired.
func assertReleased(t testing.TB, p *tenantdb.Pool, tenant string) {
	t.Helper()
	if n := inUse(p, tenant); n != 0 {
		t.Fatalf("tenant %s still holds %d slots", tenant, n)
	}
	eventually(t, "no shared connection is acquired", func() bool { return p.Stat().AcquiredConns() == 0 })
}

// eventually is tenantdbtest.Eventually with a minute's deadline, which
// matters only on failure.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	tenantdbtest.Eventually(t, time.Minute, what, cond)
}

// rlsRole is a role without SUPERUSER or BYPASSRLS: row-level security
// policies apply to it.
const rlsRole = "tenantsql_rls_app"

// setupRLS creates, as the superuser, table docs with a row-level security
// policy on app.tenant_id (tenant a has 2 rows, b 1; FORCE ROW LEVEL
// SECURITY) and returns a DSN for rlsRole.
func setupRLS(t testing.TB) string {
	t.Helper()
	return pgtest.AppRole(t, sharedPG.DSN, rlsRole, `
drop table if exists docs;
create table docs (id bigserial primary key, tenant text not null default current_setting('app.tenant_id', true), body text not null);
alter table docs enable row level security;
alter table docs force row level security;
create policy tenant_isolation on docs
	using (tenant = current_setting('app.tenant_id', true))
	with check (tenant = current_setting('app.tenant_id', true));
grant select, insert, update, delete on docs to `+rlsRole+`;
grant usage on sequence docs_id_seq to `+rlsRole+`;
insert into docs (tenant, body) values ('a', 'a1'), ('a', 'a2'), ('b', 'b1');
`)
}

// rlsSession sets app.tenant_id for the policy of setupRLS.
var rlsSession = tenantdb.Session{TenantSetting: "app.tenant_id"}
