package tenantsql_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/tenantdb/tenantdb/internal/pgtest"
	"github.com/tenantdb/tenantdb/tenantdb"
)

// schemaRole owns nothing but may use the schemas of setupSchemas.
const schemaRole = "tenantsql_schema_app"

// setupSchemas creates a schema per tenant (tsql_a, tsql_b) with a table
// items of one row naming its tenant, owned by schemaRole, and returns a
// DSN for schemaRole.
func setupSchemas(t *testing.T) string {
	t.Helper()
	return pgtest.AppRole(t, sharedPG.DSN, schemaRole, `
drop schema if exists tsql_a cascade;
drop schema if exists tsql_b cascade;
create schema tsql_a authorization `+schemaRole+`;
create schema tsql_b authorization `+schemaRole+`;
create table tsql_a.items (name text);
create table tsql_b.items (name text);
alter table tsql_a.items owner to `+schemaRole+`;
alter table tsql_b.items owner to `+schemaRole+`;
insert into tsql_a.items values ('in a');
insert into tsql_b.items values ('in b');
`)
}

// newSchemaPool is a Pool whose tenants each find their own schema first,
// under ScopeTransaction, in pgx's exec mode (as a SearchPath there needs).
func newSchemaPool(t *testing.T, dsn string) *tenantdb.Pool {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 2
	pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	p, err := tenantdb.New(context.Background(), pcfg, tenantdb.Config{
		Plans: map[string]tenantdb.Plan{"std": {MaxConns: 1}},
		Session: tenantdb.Session{
			TenantSetting: "app.tenant_id",
			SearchPath:    func(id string) []string { return []string{"tsql_" + id} },
			Scope:         tenantdb.ScopeTransaction,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestPreparedStatementsWithASchemaPerTenant: under ScopeTransaction with a
// SearchPath, a statement prepared on the *sql.DB (as GORM's PrepareStmt and
// sqlx's prepared statements do) finds each tenant's own table, as an
// unprepared query does; PrepareContext outside a transaction parsed it
// before the tenant's search_path was set.
func TestPreparedStatementsWithASchemaPerTenant(t *testing.T) {
	p := newSchemaPool(t, setupSchemas(t))
	db := openDB(t, p)

	stmt, err := db.PrepareContext(as("a"), "select name from items where $1::int = 1")
	if err != nil {
		t.Fatalf("PrepareContext: %v", err)
	}
	defer stmt.Close()
	ins, err := db.PrepareContext(as("b"), "insert into items values ($1)")
	if err != nil {
		t.Fatalf("PrepareContext of an insert: %v", err)
	}
	defer ins.Close()
	if _, err := ins.ExecContext(as("b"), "b2"); err != nil {
		t.Fatalf("a prepared insert as b: %v", err)
	}
	for _, tenant := range []string{"a", "b", "a"} {
		var name string
		if err := stmt.QueryRowContext(as(tenant), 1).Scan(&name); err != nil || name != "in "+tenant {
			t.Errorf("the prepared query as %s: %q, %v; want %q", tenant, name, err, "in "+tenant)
		}
	}
	// Inside a transaction, the statement is prepared in it.
	tx, err := db.BeginTx(as("b"), nil)
	if err != nil {
		t.Fatal(err)
	}
	txStmt, err := tx.PrepareContext(as("b"), "select count(*) from items")
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := txStmt.QueryRowContext(as("b")).Scan(&n); err != nil || n != 2 {
		t.Errorf("a statement prepared in b's transaction counts %d, %v; want 2", n, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	// GORM's statement cache starts an eviction goroutine that never ends,
	// unless its TTL is its own "no eviction" value (ten years).
	g, err := gorm.Open(postgres.New(postgres.Config{Conn: db}), &gorm.Config{
		PrepareStmt: true, PrepareStmtTTL: 10 * 365 * 24 * time.Hour, Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"a", "b"} {
		var names []string
		if err := g.WithContext(as(tenant)).Table("items").Order("name").Pluck("name", &names).Error; err != nil {
			t.Fatalf("GORM with PrepareStmt as %s: %v", tenant, err)
		}
		if want := map[string]string{"a": "in a", "b": "b2,in b"}[tenant]; strings.Join(names, ",") != want {
			t.Errorf("GORM with PrepareStmt as %s: %v; want %s", tenant, names, want)
		}
	}
	assertReleased(t, p, "a")
	assertReleased(t, p, "b")
}

// TestStatementsThatCannotRunInATransaction: under ScopeTransaction, an
// ExecContext of CREATE INDEX CONCURRENTLY or VACUUM (as in goose's NO
// TRANSACTION migrations) fails with tenantdb.ErrCannotRunInTransaction,
// and holds nothing afterwards.
func TestStatementsThatCannotRunInATransaction(t *testing.T) {
	p := newSchemaPool(t, setupSchemas(t))
	db := openDB(t, p)
	for _, sql := range []string{"create index concurrently items_name on items (name)", "vacuum items"} {
		_, err := db.ExecContext(as("a"), sql)
		var pgErr *pgconn.PgError
		if !errors.Is(err, tenantdb.ErrCannotRunInTransaction) || !errors.As(err, &pgErr) || pgErr.Code != "25001" {
			t.Errorf("%s: %v; want ErrCannotRunInTransaction with the server's 25001", sql, err)
		}
		rows, err := db.QueryContext(as("a"), sql)
		if err == nil {
			rows.Close()
		}
		if !errors.Is(err, tenantdb.ErrCannotRunInTransaction) {
			t.Errorf("QueryContext of %s: %v; want ErrCannotRunInTransaction", sql, err)
		}
	}
	assertReleased(t, p, "a")
}
