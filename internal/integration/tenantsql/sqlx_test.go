package tenantsql_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// TestSQLX runs a tenant's queries through sqlx on OpenDB: Select and Get
// see only the tenant's rows under row-level security, NamedExec inserts in
// a Beginx transaction that holds one slot until Commit, and nothing stays
// held.
func TestSQLX(t *testing.T) {
	dsn := setupRLS(t)
	p := newPool(t, dsn, 2, tenantdb.Plan{MaxConns: 1}, rlsSession)
	db := sqlx.NewDb(openDB(t, p), "pgx")

	for tenant, want := range map[string][]string{"a": {"a1", "a2"}, "b": {"b1"}} {
		var got []string
		if err := db.SelectContext(as(tenant), &got, "select body from docs order by body"); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("sqlx Select as %s: %v; want %v", tenant, got, want)
		}
		assertReleased(t, p, tenant)
	}

	tx, err := db.BeginTxx(as("a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.NamedExecContext(as("a"), "insert into docs (body) values (:body)", map[string]any{"body": "a3"}); err != nil {
		t.Fatal(err)
	}
	if n := inUse(p, "a"); n != 1 {
		t.Fatalf("an sqlx transaction holds %d slots; want 1", n)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	assertReleased(t, p, "a")

	var doc struct {
		Tenant string `db:"tenant"`
		Body   string `db:"body"`
	}
	if err := db.GetContext(as("a"), &doc, "select tenant, body from docs where body = $1", "a3"); err != nil || doc.Tenant != "a" {
		t.Fatalf("sqlx Get as a of the row a inserted: %+v, %v", doc, err)
	}
	if err := db.GetContext(as("b"), &doc, "select tenant, body from docs where body = $1", "a3"); err == nil {
		t.Fatalf("tenant b read tenant a's row: %+v", doc)
	}
	if err := db.GetContext(as("a"), new(int), "select body from docs limit 1"); err == nil {
		t.Fatal("sqlx scanned text into an int")
	}
	if err := db.SelectContext(t.Context(), new([]string), "select body from docs"); !errors.Is(err, tenantdb.ErrNoTenant) {
		t.Fatalf("sqlx Select without a tenant: %v; want ErrNoTenant", err)
	}
	assertReleased(t, p, "a")
	assertReleased(t, p, "b")
}
